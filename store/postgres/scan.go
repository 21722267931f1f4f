package postgres

import (
	"encoding/binary"
	"errors"
	"math"
	"net/http"
	"time"

	"github.com/idem-go/idem/idemstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// recordColumns are the types of the record columns of queries/records.sql, in order,
// with the store's time last; the claim statement has a boolean before them.
var recordColumns = [...]uint32{
	pgtype.TextOID,        // id
	pgtype.Int4OID,        // fingerprint_version
	pgtype.ByteaOID,       // fingerprint
	pgtype.TextOID,        // state
	pgtype.TextOID,        // lock_token
	pgtype.TimestamptzOID, // lease_end
	pgtype.Int4OID,        // response_status
	pgtype.ByteaOID,       // response_headers
	pgtype.ByteaOID,       // response_body
	pgtype.BoolOID,        // response_not_stored
	pgtype.BoolOID,        // outcome_unknown
	pgtype.TextOID,        // recovery_point
	pgtype.ByteaOID,       // steps
	pgtype.TextOID,        // operation
	pgtype.TimestamptzOID, // created_at
	pgtype.TimestamptzOID, // expires_at
	pgtype.TimestamptzOID, // now
}

// recordRow is a pgx.RowScanner that decodes the record columns from the row's
// binary values itself. pgx plans a scan afresh for every row it scans and each plan
// for a nullable column allocates, which made scanning a record cost as much as the
// rest of a replay; this does it in a few allocations. A row in any other form (the
// text format of the simple protocol, other column types) goes through pgx's Scan.
type recordRow struct {
	claimed *bool // the claim statement's leading column, when non-nil
	raw     rawRecord
}

// rawRecord is a record row as decoded, before it becomes an idem.Record.
type rawRecord struct {
	rec      *idemstore.Record
	fp       []byte
	state    string
	token    *string
	leaseEnd *time.Time
	status   *int32
	headers  []byte
	// header is headers decoded, when headerDecoded.
	header        http.Header
	headerErr     error
	headerDecoded bool
	body          []byte
	notStored     bool
	unknown       bool
	recovery      *string
	steps         []byte
	operation     *string
	now           time.Time
}

func (s *recordRow) ScanRow(rows pgx.Rows) error {
	fields, values := rows.FieldDescriptions(), rows.RawValues()
	if !s.binaryForm(fields) || len(values) != len(fields) {
		return rows.Scan(s.dest()...)
	}
	if s.claimed != nil {
		b, err := decodeBool(values[0])
		if err != nil {
			return err
		}
		*s.claimed = b
		values = values[1:]
	}
	return s.raw.decode(values)
}

// binaryForm reports whether every column has the expected type in binary format;
// text is the same in either format (pgx asks for text columns as text).
func (s *recordRow) binaryForm(fields []pgconn.FieldDescription) bool {
	if s.claimed != nil {
		if len(fields) == 0 || fields[0].DataTypeOID != pgtype.BoolOID || fields[0].Format != pgtype.BinaryFormatCode {
			return false
		}
		fields = fields[1:]
	}
	if len(fields) != len(recordColumns) {
		return false
	}
	for i, f := range fields {
		if f.DataTypeOID != recordColumns[i] || !(f.Format == pgtype.BinaryFormatCode || f.DataTypeOID == pgtype.TextOID) {
			return false
		}
	}
	return true
}

// dest are the scan destinations of pgx's Scan, for rows in another form.
func (s *recordRow) dest() []any {
	r := &s.raw
	dest := []any{&r.rec.ID, &r.rec.Fingerprint.Version, &r.fp, &r.state, &r.token, &r.leaseEnd,
		&r.status, &r.headers, &r.body, &r.notStored, &r.unknown, &r.recovery, &r.steps, &r.operation, &r.rec.CreatedAt, &r.rec.ExpiresAt, &r.now}
	if s.claimed != nil {
		dest = append([]any{s.claimed}, dest...)
	}
	return dest
}

var errBadColumn = errors.New("postgres: record column has an unexpected binary value")

// decode reads the binary values of the record columns. NOT NULL columns that are
// NULL are an error, as pgx's Scan into a non-pointer is.
func (r *rawRecord) decode(v [][]byte) error {
	var err error
	if r.rec.ID, err = decodeText(v[0]); err != nil {
		return err
	}
	version, err := decodeInt4(v[1])
	if err != nil {
		return err
	}
	r.rec.Fingerprint.Version = int(version)
	// The values are pgx's read buffer, valid only until the row is closed: what
	// stays is copied (or decoded) here.
	if v[2] == nil {
		return errBadColumn
	}
	r.fp = r.rec.Fingerprint.Sum[:]
	if len(v[2]) == len(r.fp) {
		copy(r.fp, v[2])
	} else {
		r.fp = append([]byte{}, v[2]...) // refused by scanRecord
	}
	if r.state, err = decodeText(v[3]); err != nil {
		return err
	}
	if r.token, err = nullText(v[4]); err != nil {
		return err
	}
	if v[5] != nil {
		t, err := decodeTimestamptz(v[5])
		if err != nil {
			return err
		}
		r.leaseEnd = &t
	}
	if v[6] != nil {
		n, err := decodeInt4(v[6])
		if err != nil {
			return err
		}
		r.status = &n
	}
	if r.state == string(idemstore.StateCompleted) {
		r.header, r.headerErr = decodeHeaders(v[7])
		r.headerDecoded = true
	}
	if v[8] != nil {
		r.body = append([]byte{}, v[8]...)
	}
	if r.notStored, err = decodeBool(v[9]); err != nil {
		return err
	}
	if r.unknown, err = decodeBool(v[10]); err != nil {
		return err
	}
	if r.recovery, err = nullText(v[11]); err != nil {
		return err
	}
	if v[12] != nil {
		r.steps = append([]byte{}, v[12]...)
	}
	if r.operation, err = nullText(v[13]); err != nil {
		return err
	}
	if r.rec.CreatedAt, err = decodeTimestamptz(v[14]); err != nil {
		return err
	}
	if r.rec.ExpiresAt, err = decodeTimestamptz(v[15]); err != nil {
		return err
	}
	r.now, err = decodeTimestamptz(v[16])
	return err
}

func decodeText(b []byte) (string, error) {
	if b == nil {
		return "", errBadColumn
	}
	// The states are constants: no allocation for them.
	switch string(b) {
	case string(idemstore.StateCompleted):
		return string(idemstore.StateCompleted), nil
	case string(idemstore.StateInFlight):
		return string(idemstore.StateInFlight), nil
	}
	return string(b), nil
}

func nullText(b []byte) (*string, error) {
	if b == nil {
		return nil, nil
	}
	s := string(b)
	return &s, nil
}

func decodeInt4(b []byte) (int32, error) {
	if len(b) != 4 {
		return 0, errBadColumn
	}
	return int32(binary.BigEndian.Uint32(b)), nil
}

func decodeBool(b []byte) (bool, error) {
	if len(b) != 1 {
		return false, errBadColumn
	}
	return b[0] == 1, nil
}

// pgEpochMicros is 2000-01-01 00:00:00 UTC, PostgreSQL's epoch, in Unix microseconds.
const pgEpochMicros = 946684800 * 1000000

// decodeTimestamptz reads a binary timestamptz: microseconds since 2000-01-01 UTC.
// Infinities have no time.Time and are an error.
func decodeTimestamptz(b []byte) (time.Time, error) {
	if len(b) != 8 {
		return time.Time{}, errBadColumn
	}
	us := int64(binary.BigEndian.Uint64(b))
	if us == math.MaxInt64 || us == math.MinInt64 {
		return time.Time{}, errBadColumn
	}
	return time.UnixMicro(us + pgEpochMicros).UTC(), nil
}
