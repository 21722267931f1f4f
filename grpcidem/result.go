package grpcidem

import (
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idem-go/idem"
)

// How a call's outcome is kept in an [idem.Response]:
//
//   - a response message: status 200, Content-Type
//     `application/protobuf; messagetype=pkg.Message`, and the message's encoding;
//   - a status error that the store policy keeps: the HTTP status gRPC's code maps to
//     (FAILED_PRECONDITION: 400; see httpStatus), Grpc-Status: the code's number, and
//     the google.rpc.Status (code, message, details) encoded, with its messagetype.
//
// The record shows as much to an operator (`idem keys get`) as an HTTP one does.
const (
	mediaType       = "application/protobuf"
	headerGRPCState = "Grpc-Status"
)

// errNotAResult is wrapped by the error of a stored response that is not the outcome
// of a call this package stored (or whose message type is unknown to this binary).
var errNotAResult = errors.New("not a gRPC call's stored outcome")

func contentType(msg proto.Message) string {
	return mime.FormatMediaType(mediaType, map[string]string{"messagetype": string(msg.ProtoReflect().Descriptor().FullName())})
}

// encodeMessage keeps a response message; one whose encoding exceeds limit completes
// the record as not stored (SPEC §6).
func encodeMessage(msg proto.Message, limit int) (*idem.Response, error) {
	b, err := proto.Marshal(msg)
	if err != nil {
		return nil, err
	}
	r := &idem.Response{Status: http.StatusOK, Header: http.Header{"Content-Type": {contentType(msg)}}}
	if len(b) > limit {
		r.NotStored = true
		return r, nil
	}
	r.Body = b
	return r, nil
}

// encodeStatus keeps a status error: its code, message and details.
func encodeStatus(st *status.Status) (*idem.Response, error) {
	p := st.Proto()
	b, err := proto.Marshal(p)
	if err != nil {
		return nil, err
	}
	return &idem.Response{Status: httpStatus(st.Code()), Body: b, Header: http.Header{
		"Content-Type":  {contentType(p)},
		headerGRPCState: {strconv.Itoa(int(st.Code()))},
	}}, nil
}

// decodeResult returns the outcome stored in r: the response message decoded into
// its type, found by name in types, or the status error.
func decodeResult(r *idem.Response, types protoregistry.MessageTypeResolver) (any, error) {
	if r.Header.Get(headerGRPCState) != "" {
		p := new(spb.Status)
		if err := proto.Unmarshal(r.Body, p); err != nil || p.Code == int32(codes.OK) {
			return nil, fmt.Errorf("%w: a stored status that does not decode (%v)", errNotAResult, err)
		}
		return nil, status.FromProto(p).Err()
	}
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != mediaType || params["messagetype"] == "" {
		return nil, fmt.Errorf("%w: Content-Type %q", errNotAResult, r.Header.Get("Content-Type"))
	}
	name := protoreflect.FullName(params["messagetype"])
	typ, err := types.FindMessageByName(name)
	if err != nil {
		return nil, fmt.Errorf("%w: message type %s: %v", errNotAResult, name, err)
	}
	msg := typ.New().Interface()
	if err := proto.Unmarshal(r.Body, msg); err != nil {
		return nil, fmt.Errorf("%w: decoding a %s: %v", errNotAResult, name, err)
	}
	return msg, nil
}

// httpStatus is the HTTP status that gRPC's code maps to, as gRPC-HTTP gateways map
// it, for the record's Status.
func httpStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.Canceled:
		return 499 // client closed request
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.Aborted:
		return http.StatusConflict
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError // Unknown, Internal, DataLoss
}
