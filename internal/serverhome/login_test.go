package serverhome

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"
)

// A login key must sign exactly as crypto/ed25519 signs with the key nkeys
// derives from the same seed: the server verifies with that key.
func TestALoginKeySignsAsEd25519Does(t *testing.T) {
	for i := range 300 {
		raw := make([]byte, ed25519.SeedSize)
		msg := make([]byte, i%97)
		rand.Read(raw)
		rand.Read(msg)
		seed, err := nkeys.EncodeSeed(nkeys.PrefixByteUser, raw)
		if err != nil {
			t.Fatal(err)
		}
		key, err := newLoginKey(string(seed))
		if err != nil {
			t.Fatal(err)
		}
		kp, err := nkeys.FromSeed(seed)
		if err != nil {
			t.Fatal(err)
		}
		wantPub, _ := kp.PublicKey()
		if pub, err := key.PublicKey(); err != nil || pub != wantPub {
			t.Fatalf("seed %x: public key %q, %v; nkeys says %q", raw, pub, err, wantPub)
		}
		want, _ := kp.Sign(msg)
		got, err := key.Sign(msg)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("seed %x, message %x: signature %x, %v; crypto/ed25519 signs %x", raw, msg, got, err, want)
		}
	}
}

func TestALoginKeyKeepsTheSeedsKindOfKey(t *testing.T) {
	kp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	key, err := newLoginKey(string(seed))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := kp.PublicKey()
	if got, _ := key.PublicKey(); got != want {
		t.Fatalf("public key %q, want %q", got, want)
	}
}

// RFC 8032's first two test vectors (section 7.1): the key from the secret, the
// signature of the message.
func TestALoginKeySignsRFC8032sVectors(t *testing.T) {
	for _, v := range []struct{ secret, public, message, signature string }{
		{"9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
			"d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", "",
			"e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"},
		{"4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
			"3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c", "72",
			"92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00"},
	} {
		secret, _ := hex.DecodeString(v.secret)
		message, _ := hex.DecodeString(v.message)
		seed, err := nkeys.EncodeSeed(nkeys.PrefixByteUser, secret)
		if err != nil {
			t.Fatal(err)
		}
		key, err := newLoginKey(string(seed))
		if err != nil {
			t.Fatal(err)
		}
		if got := hex.EncodeToString(key.public); got != v.public {
			t.Errorf("secret %s: public key %s, want %s", v.secret, got, v.public)
		}
		if sig, err := key.Sign(message); err != nil || hex.EncodeToString(sig) != v.signature {
			t.Errorf("secret %s: signature %x (%v), want %s", v.secret, sig, err, v.signature)
		}
	}
}

func TestCredentialsThatAreNoSeedAreRefused(t *testing.T) {
	curve, err := nkeys.CreateCurveKeys()
	if err != nil {
		t.Fatal(err)
	}
	curveSeed, _ := curve.Seed()
	for _, seed := range []string{"", "SUAGARBAGE", "UAD2TDUOFUPGE3KF7D6V2YBWVCBP6BJFKUQY6AFUVGMSCBRTIAXRJBBS", string(curveSeed)} {
		if _, err := (Credentials{Seed: seed}).NATSOption(); err == nil {
			t.Errorf("seed %q: no error", seed)
		}
	}
}

// BenchmarkFirstLogin is what a command that connects once pays to sign: the
// public key and one signature in a process of its own, by the login key and by
// nkeys (crypto/ed25519), less the start of that process.
func BenchmarkFirstLogin(b *testing.B) {
	if os.Getenv("BGTASK_LOGIN_CHILD") != "" {
		b.Skip("a child of this benchmark")
	}
	seed, _ := nkeys.EncodeSeed(nkeys.PrefixByteUser, make([]byte, ed25519.SeedSize))
	for _, by := range []string{"none", "login-key", "nkeys"} {
		b.Run(by, func(b *testing.B) {
			for b.Loop() {
				cmd := exec.Command(os.Args[0], "-test.run=^TestLoginChild$", "-test.count=1")
				cmd.Env = append(os.Environ(), "BGTASK_LOGIN_CHILD="+by, "BGTASK_LOGIN_SEED="+string(seed))
				if out, err := cmd.CombinedOutput(); err != nil {
					b.Fatalf("%v: %s", err, out)
				}
			}
		})
	}
}

// TestLoginChild signs once as BenchmarkFirstLogin's child asks.
func TestLoginChild(t *testing.T) {
	seed := os.Getenv("BGTASK_LOGIN_SEED")
	var key interface {
		PublicKey() (string, error)
		Sign([]byte) ([]byte, error)
	}
	var err error
	switch os.Getenv("BGTASK_LOGIN_CHILD") {
	case "":
		t.Skip("run by BenchmarkFirstLogin")
	case "none":
		return
	case "login-key":
		key, err = newLoginKey(seed)
	case "nkeys":
		key, err = nkeys.FromSeed([]byte(seed))
	}
	if err == nil {
		_, err = key.PublicKey()
	}
	if err == nil {
		_, err = key.Sign([]byte("nonce"))
	}
	if err != nil {
		t.Fatal(err)
	}
}

func TestADamagedSeedOnDiskIsRefusedSayingWhere(t *testing.T) {
	home := t.TempDir()
	for name, data := range map[string]string{
		CredentialsFile: `{"nkey_seed": "SUAGARBAGE"}`,
		ClientSeedFile:  "SUAGARBAGE\n",
	} {
		if err := os.WriteFile(filepath.Join(home, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ReadCredentials(home); err == nil || !strings.Contains(err.Error(), CredentialsFile+" is damaged") {
		t.Errorf("ReadCredentials: %v", err)
	}
	if _, err := ReadSeedFile(filepath.Join(home, ClientSeedFile)); err == nil || !strings.Contains(err.Error(), ClientSeedFile+" is damaged") {
		t.Errorf("ReadSeedFile: %v", err)
	}
	creds, err := NewCredentials()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, CredentialsFile), []byte(`{"nkey_seed": "`+creds.Seed+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadCredentials(home); err != nil || got != creds {
		t.Errorf("ReadCredentials of a good seed: %v, %v", got, err)
	}
}
