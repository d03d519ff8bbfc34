package serverhome

import (
	"crypto/sha512"

	"filippo.io/edwards25519"
	"github.com/nats-io/nkeys"
)

// loginKey is an identity's Ed25519 key, derived from its nkey seed as nkeys
// derives it, held to sign the server's nonce at each connect.
//
// It signs as crypto/ed25519 signs (RFC 8032, the same bytes), but multiplies by
// the base point as by any point: crypto/ed25519 first builds a table of the base
// point's multiples, about 1 ms of CPU, which a command that signs once pays in
// full, a tenth of a `bgtask add`. Both multiplications take constant time.
type loginKey struct {
	prefix nkeys.PrefixByte
	secret *edwards25519.Scalar // the clamped first half of the seed's hash
	salt   []byte               // its second half, from which a signature's nonce is hashed
	public []byte
}

// newLoginKey decodes an nkey seed. A curve key's seed (X25519) is refused, as
// nkeys refuses to sign with it.
func newLoginKey(seed string) (loginKey, error) {
	prefix, raw, err := nkeys.DecodeSeed([]byte(seed))
	if err != nil {
		return loginKey{}, err
	}
	if prefix == nkeys.PrefixByteCurve {
		return loginKey{}, nkeys.ErrInvalidCurveKeyOperation
	}
	h := sha512.Sum512(raw)
	secret, _ := edwards25519.NewScalar().SetBytesWithClamping(h[:32]) // fails only for a length other than 32
	public := new(edwards25519.Point).ScalarMult(secret, edwards25519.NewGeneratorPoint()).Bytes()
	return loginKey{prefix: prefix, secret: secret, salt: h[32:], public: public}, nil
}

// PublicKey is the key as nkeys encodes it: the user the server knows.
func (k loginKey) PublicKey() (string, error) {
	pub, err := nkeys.Encode(k.prefix, k.public)
	return string(pub), err
}

// Sign signs msg as ed25519.Sign does with the key nkeys derives from the seed.
// It never fails; its error is the one a NATS signature handler returns.
func (k loginKey) Sign(msg []byte) ([]byte, error) {
	r := hashToScalar(k.salt, msg)
	R := new(edwards25519.Point).ScalarMult(r, edwards25519.NewGeneratorPoint()).Bytes()
	S := edwards25519.NewScalar().MultiplyAdd(hashToScalar(R, k.public, msg), k.secret, r)
	return append(R, S.Bytes()...), nil
}

// hashToScalar is the SHA-512 of parts, reduced modulo the group's order.
func hashToScalar(parts ...[]byte) *edwards25519.Scalar {
	h := sha512.New()
	for _, p := range parts {
		h.Write(p)
	}
	s, _ := edwards25519.NewScalar().SetUniformBytes(h.Sum(nil)) // fails only for a length other than 64
	return s
}
