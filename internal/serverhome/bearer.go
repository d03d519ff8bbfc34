package serverhome

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sync"
)

// BearersDir holds the bearer tokens a home declares for webhook sinks, one file
// NAME.json each (0600, in a folder 0700): what a setup such as 'bgtask setup
// openclaw' gives the server without a flag or a restart. The server reads a
// declaration at each use; no API returns it.
const BearersDir = "bearers"

// Bearer is a bearer token a home declares: the token, and the URL prefixes it
// may be sent to (as --webhook-bearer's URLPREFIX).
type Bearer struct {
	Token       string   `json:"token"`
	URLPrefixes []string `json:"url_prefixes"`
}

// bearerName is what a bearer's name may be: a file name, never a path. It is
// compiled when first used: its 128 repeats cost every command's start 2 ms.
var bearerName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`) })

func bearerFile(home, name string) (string, error) {
	if !bearerName().MatchString(name) {
		return "", fmt.Errorf("bearer name %q: want 1-128 letters, digits, '-' or '_'", name)
	}
	return filepath.Join(home, BearersDir, name+".json"), nil
}

// ReadBearer reads the bearer name that home declares; fs.ErrNotExist when it
// declares none. An error never holds the token.
func ReadBearer(home, name string) (Bearer, error) {
	var b Bearer
	path, err := bearerFile(home, name)
	if err != nil {
		return b, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return b, err
	}
	if err := json.Unmarshal(data, &b); err != nil || len(b.URLPrefixes) == 0 {
		return Bearer{}, fmt.Errorf("its declaration in the server's home (%s/%s.json) is damaged: run the setup that wrote it again", BearersDir, name)
	}
	return b, nil
}

// WriteBearer declares bearer name in home, replacing what it declared.
func WriteBearer(home, name string, b Bearer) error {
	path, err := bearerFile(home, name)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	data, _ := json.MarshalIndent(b, "", "  ")
	return WriteFileAtomic(path, data)
}

// RemoveBearer takes the declaration of bearer name out of home, and reports
// whether there was one.
func RemoveBearer(home, name string) (bool, error) {
	path, err := bearerFile(home, name)
	if err != nil {
		return false, err
	}
	err = os.Remove(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}
