package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TLS is a certificate authority of a test's own and a certificate it signed for
// 127.0.0.1, in files that redis-server reads.
type TLS struct {
	CertFile, KeyFile, CAFile string
	// Roots holds the authority, for a client that verifies the servers.
	Roots *x509.CertPool
}

// NewTLS makes a certificate authority and a server certificate for 127.0.0.1 (and
// localhost), valid for a day, in t's temporary directory.
func NewTLS(t testing.TB) *TLS {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "redistest CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	c := &TLS{CertFile: filepath.Join(dir, "server.crt"), KeyFile: filepath.Join(dir, "server.key"),
		CAFile: filepath.Join(dir, "ca.crt"), Roots: x509.NewCertPool()}
	c.Roots.AddCert(ca)
	for file, block := range map[string]*pem.Block{
		c.CertFile: {Type: "CERTIFICATE", Bytes: der},
		c.KeyFile:  {Type: "EC PRIVATE KEY", Bytes: keyDER},
		c.CAFile:   {Type: "CERTIFICATE", Bytes: caDER},
	} {
		if err := os.WriteFile(file, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// args are redis-server's TLS settings: the certificate, no client certificates
// asked for, and TLS to the master for replication (and for a Sentinel, to the servers
// it watches).
func (c *TLS) args() []string {
	return []string{"--tls-cert-file", c.CertFile, "--tls-key-file", c.KeyFile, "--tls-ca-cert-file", c.CAFile,
		"--tls-auth-clients", "no", "--tls-replication", "yes"}
}

// ClientConfig is a client's TLS configuration that verifies the servers.
func (c *TLS) ClientConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: c.Roots}
}
