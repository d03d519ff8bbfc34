package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/internal/serverhome"
)

// natsContext is the part of a nats CLI context (natscli's natscontext package,
// ~/.config/nats/context/NAME.json) that reaches an embedded server: its URL and
// the file of an nkey seed.
type natsContext struct {
	Description string `json:"description"`
	URL         string `json:"url"`
	NKey        string `json:"nkey"`
}

func natsContextCmd(g *globals) *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "nats-context",
		Short: "Save a nats CLI context for the server of the home, as its client identity",
		Long: `Save a context for the nats CLI (github.com/nats-io/natscli) that reaches the
server of the home: its URL from server.json and the client identity's seed file
(client.nkey in the home, mode 0600, which the server writes at each start). The
context goes to $XDG_CONFIG_HOME/nats/context/NAME.json (else
~/.config/nats/context/NAME.json), replacing one of the same name; nothing is
selected. The server keeps its port over restarts, so the context stays good.

The client identity may call the API and read the streams, never publish an
event (docs/security.md).`,
		Example: `  bgtask server nats-context
  nats --context bgtask micro ls
  nats --context bgtask req bgtask.list '{}'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !client.ValidName(name) {
				return usageErr("--name %q: use letters, digits, '-' and '_'", name)
			}
			home, err := serverhome.Dir(g.home)
			if err != nil {
				return err
			}
			d, err := serverhome.ReadDiscovery(home)
			if errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("no bgtask server in %s: start one with 'bgtask server' first, the context takes its URL", home)
			}
			if err != nil {
				return err
			}
			seed := filepath.Join(home, serverhome.ClientSeedFile)
			if _, err := serverhome.ReadSeedFile(seed); err != nil {
				return fmt.Errorf("the client identity: %w (a server of this version writes it at start)", err)
			}
			path, err := natsContextPath(name)
			if err != nil {
				return err
			}
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				return err
			}
			data, _ := json.MarshalIndent(natsContext{Description: "bgtask server of " + home, URL: d.URL, NKey: seed}, "", "  ")
			if err := serverhome.WriteFileAtomic(path, data); err != nil {
				return err
			}
			_, err = fmt.Fprintf(g.stdout, "wrote %s (%s as the client identity)\nuse it: nats --context %s micro ls\n", path, d.URL, name)
			return err
		},
	}
	cmd.Flags().StringVar(&name, "name", "bgtask", "name of the context")
	return cmd
}

// natsContextPath is where the nats CLI looks for the context name.
func natsContextPath(name string) (string, error) {
	root := os.Getenv("XDG_CONFIG_HOME")
	if root == "" {
		userHome, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("no home directory to save the context in: set XDG_CONFIG_HOME: %w", err)
		}
		root = filepath.Join(userHome, ".config")
	}
	return filepath.Join(root, "nats", "context", name+".json"), nil
}
