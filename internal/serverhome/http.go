package serverhome

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// The files of the HTTP API and of the webhooks' signatures in a home.
const (
	// HTTPFile tells clients where the HTTP API listens and its bearer token.
	HTTPFile = "http.json"
	// MetricsTokenFile holds the bearer token that reads GET /metrics and
	// nothing else. Made once and kept, unlike HTTPFile's token: a scraper's
	// configuration names the file once.
	MetricsTokenFile = "metrics.token"
	// WebhookSecretFile holds the key webhook bodies are signed with, unless the
	// server is given a file of its own.
	WebhookSecretFile = "webhook-secret"
)

// HTTPInfo is the content of HTTPFile.
type HTTPInfo struct {
	URL   string `json:"url"`
	Token string `json:"token"`
	PID   int    `json:"pid"`
}

// ReadHTTPInfo reads the home's HTTPFile.
func ReadHTTPInfo(home string) (HTTPInfo, error) {
	var info HTTPInfo
	data, err := os.ReadFile(filepath.Join(home, HTTPFile))
	if err != nil {
		return info, err
	}
	if err := json.Unmarshal(data, &info); err != nil || info.URL == "" || info.Token == "" {
		return info, fmt.Errorf("%s is damaged: restart the server to write it again", filepath.Join(home, HTTPFile))
	}
	return info, nil
}

// WriteHTTPInfo writes the home's HTTPFile (0600).
func WriteHTTPInfo(home string, info HTTPInfo) error {
	data, _ := json.MarshalIndent(info, "", "  ")
	return WriteFileAtomic(filepath.Join(home, HTTPFile), data)
}
