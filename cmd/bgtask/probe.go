package main

import (
	"os"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"

	"github.com/bgtask/bgtask/engine/server"
	"github.com/bgtask/bgtask/internal/secretenv"
)

// probeFlags name the identity clients use, so the engine can check that it
// cannot write events.
type probeFlags struct {
	user, creds, nkey string
}

func (p *probeFlags) register(f *pflag.FlagSet) {
	f.StringVar(&p.user, "client-user", "", "with --nats: the NATS user clients register tasks as (password in $BGTASK_CLIENT_PASSWORD); the server refuses to run if it can publish events")
	f.StringVar(&p.creds, "client-creds", "", "with --nats: the credentials file of the client identity, checked like --client-user")
	f.StringVar(&p.nkey, "client-nkey", "", "with --nats: the nkey seed file of the client identity, checked like --client-user")
}

// options are the probe's: the deployment's TLS options and the client identity,
// if one is given.
func (p *probeFlags) options(auth *natsAuth) (server.ProbeOptions, error) {
	var o server.ProbeOptions
	var err error
	if o.TLS, err = auth.tlsOptions(); err != nil {
		return o, err
	}
	given := 0
	if p.user != "" {
		given++
		password := os.Getenv("BGTASK_CLIENT_PASSWORD")
		secretenv.Hold(password)
		o.Client = &server.ClientIdentity{Name: "client user " + p.user, Options: []nats.Option{nats.UserInfo(p.user, password)}}
	}
	if p.creds != "" {
		given++
		if err := holdCredsSeed(p.creds); err != nil {
			return o, err
		}
		o.Client = &server.ClientIdentity{Name: "client credentials " + p.creds, Options: []nats.Option{nats.UserCredentials(p.creds)}}
	}
	if p.nkey != "" {
		given++
		opt, err := nkeyOption(p.nkey)
		if err != nil {
			return o, err
		}
		o.Client = &server.ClientIdentity{Name: "client nkey " + p.nkey, Options: []nats.Option{opt}}
	}
	if given > 1 {
		return o, usageErr("--client-user, --client-creds and --client-nkey: give one client identity")
	}
	return o, nil
}
