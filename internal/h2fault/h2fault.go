// Package h2fault is an HTTPS upstream speaking HTTP/2 that resets the stream of a
// request with RST_STREAM PROTOCOL_ERROR after acting on it: the fault by which Go's
// HTTP/2 client re-sends a request by itself (http2canRetryError), which the proxy's
// tests (SPEC §17, "nothing below the proxy re-sends") put in front of `idem proxy`. It
// speaks HTTP/2 with golang.org/x/net/http2's framer, since net/http's own server never
// answers PROTOCOL_ERROR to a well-formed request.
//
// It counts every request it receives by the value of its Idempotency-Key header (the
// proxy's derived key) and answers as its Mode says; a request without one is answered
// 200 and not counted.
package h2fault

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Mode says which requests the server resets.
type Mode int

const (
	// ResetOnce resets the first request of each key after counting it, and answers
	// the later ones 201.
	ResetOnce Mode = iota
	// ResetAlways resets every request after counting it.
	ResetAlways
	// Answer answers every request 201 (a well-behaved HTTP/2 upstream).
	Answer
	// RefuseOnce refuses the first request of each key with RST_STREAM
	// REFUSED_STREAM before acting on it (RFC 9113 §8.7: nothing was processed), and
	// answers the later ones 201; a refused request is not counted.
	RefuseOnce
	// GoAwayOnce answers the first request of each key with a GOAWAY whose last
	// stream id is below its stream's (RFC 9113 §6.8: it was not processed) and
	// closes the connection, as nginx does past keepalive_requests or at a reload;
	// the later ones are answered 201. A request left out is not counted.
	GoAwayOnce
)

// Server is a running HTTP/2 upstream. Its zero value is not usable: call Start.
type Server struct {
	// URL is its base URL, https://127.0.0.1:PORT.
	URL string
	// CAFile is a PEM file of its self-signed certificate, for SSL_CERT_FILE.
	CAFile string
	// RootCAs trusts its certificate, for an in-process client's tls.Config.
	RootCAs *x509.CertPool

	mode    Mode
	ln      net.Listener
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   map[net.Conn]bool
	count   map[string]int
	refused map[string]int // by key: requests refused or left out, not processed
}

// Refused returns how many requests it refused or left out by a GOAWAY, unprocessed.
func (s *Server) Refused() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.refused {
		n += c
	}
	return n
}

// errGoAway ends a connection after its GOAWAY.
var errGoAway = errors.New("h2fault: GOAWAY sent")

// Start starts a server of mode on a free loopback port; its certificate is written
// to dir (for CAFile). Close stops it.
func Start(mode Mode, dir string) (*Server, error) {
	cert, certPEM, err := selfSigned()
	if err != nil {
		return nil, err
	}
	s := &Server{mode: mode, conns: map[net.Conn]bool{}, count: map[string]int{}, refused: map[string]int{}, RootCAs: x509.NewCertPool()}
	s.RootCAs.AppendCertsFromPEM(certPEM)
	s.CAFile = filepath.Join(dir, "h2fault-ca.pem")
	if err := os.WriteFile(s.CAFile, certPEM, 0o600); err != nil {
		return nil, err
	}
	s.ln, err = tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{http2.NextProtoTLS}})
	if err != nil {
		return nil, err
	}
	s.URL = "https://" + s.ln.Addr().String()
	s.wg.Go(s.accept)
	return s, nil
}

// Close stops the server and closes its connections.
func (s *Server) Close() {
	_ = s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// Deliveries returns how many requests carried key (the derived key).
func (s *Server) Deliveries(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count[key]
}

// Counts returns how many keys it received and how many requests in all.
func (s *Server) Counts() (keys, total int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.count {
		keys++
		total += n
	}
	return keys, total
}

func (s *Server) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[c] = true
		s.mu.Unlock()
		s.wg.Go(func() {
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				_ = c.Close()
			}()
			_ = s.serve(c)
		})
	}
}

// stream is a request being received.
type stream struct {
	key  string
	body bytes.Buffer
}

// serve speaks HTTP/2 on c until it closes.
func (s *Server) serve(c net.Conn) error {
	_ = c.SetDeadline(time.Now().Add(5 * time.Minute))
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, preface); err != nil || string(preface) != http2.ClientPreface {
		return errors.New("h2fault: no HTTP/2 preface")
	}
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := fr.WriteSettings(); err != nil {
		return err
	}
	streams := map[uint32]*stream{}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return err
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				if err := fr.WriteSettingsAck(); err != nil {
					return err
				}
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				if err := fr.WritePing(true, f.Data); err != nil {
					return err
				}
			}
		case *http2.MetaHeadersFrame:
			st := &stream{}
			for _, h := range f.Fields {
				if h.Name == "idempotency-key" {
					st.key = h.Value
				}
			}
			streams[f.StreamID] = st
			if f.StreamEnded() {
				if err := s.act(fr, f.StreamID, st); err != nil {
					return drainAfterGoAway(c, err)
				}
			}
		case *http2.DataFrame:
			st := streams[f.StreamID]
			if st == nil {
				continue
			}
			st.body.Write(f.Data())
			if n := len(f.Data()); n > 0 {
				// Keep the client's windows open.
				if err := fr.WriteWindowUpdate(0, uint32(n)); err != nil {
					return err
				}
			}
			if f.StreamEnded() {
				delete(streams, f.StreamID)
				if err := s.act(fr, f.StreamID, st); err != nil {
					return drainAfterGoAway(c, err)
				}
			}
		case *http2.GoAwayFrame:
			return nil
		}
	}
}

// drainAfterGoAway returns err, unless it is errGoAway: then the connection is read
// on for a second, so that closing it with the client's frames unread does not reset
// it before the client read the GOAWAY.
func drainAfterGoAway(c net.Conn, err error) error {
	if !errors.Is(err, errGoAway) {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	_, _ = io.Copy(io.Discard, c)
	return nil
}

// act counts a keyed request and resets its stream or answers it, as the mode says;
// a request without a key (a health check, a warm-up) is answered 200 uncounted.
func (s *Server) act(fr *http2.Framer, id uint32, st *stream) error {
	if st.key == "" {
		return s.answer(fr, id, "200", []byte(`{}`))
	}
	if s.mode == RefuseOnce || s.mode == GoAwayOnce {
		s.mu.Lock()
		first := s.refused[st.key] == 0 && s.count[st.key] == 0
		if first {
			s.refused[st.key]++
		}
		s.mu.Unlock()
		switch {
		case first && s.mode == RefuseOnce:
			return fr.WriteRSTStream(id, http2.ErrCodeRefusedStream)
		case first:
			last := uint32(0) // the stream before id: client streams are odd
			if id > 2 {
				last = id - 2
			}
			if err := fr.WriteGoAway(last, http2.ErrCodeNo, nil); err != nil {
				return err
			}
			return errGoAway
		}
	}
	s.mu.Lock()
	s.count[st.key]++
	n := s.count[st.key]
	s.mu.Unlock()
	if s.mode == ResetAlways || (s.mode == ResetOnce && n == 1) {
		return fr.WriteRSTStream(id, http2.ErrCodeProtocol)
	}
	return s.answer(fr, id, "201", []byte(`{"id":"ch_`+strconv.Itoa(n)+`","delivery":`+strconv.Itoa(n)+`}`))
}

// answer writes a response of status with a JSON body on stream id.
func (s *Server) answer(fr *http2.Framer, id uint32, status string, body []byte) error {
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, h := range [][2]string{{":status", status}, {"content-type", "application/json"}, {"content-length", strconv.Itoa(len(body))}} {
		if err := enc.WriteField(hpack.HeaderField{Name: h[0], Value: h[1]}); err != nil {
			return err
		}
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
		return err
	}
	return fr.WriteData(id, true, body)
}

// selfSigned returns a certificate for 127.0.0.1, valid for a day, and its PEM.
func selfSigned() (tls.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "h2fault"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		IsCA:         true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("h2fault: %w", err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, certPEM, nil
}
