package httpapi

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/bgtask/bgtask/engine/api"
)

// The dashboard's login: a one-time link (POST /v1/login, with the token), and
// the session its visit starts, kept in a cookie the page's scripts cannot read
// and that no other site's request carries.
const (
	loginTTL    = 2 * time.Minute
	sessionTTL  = 24 * time.Hour
	maxLinks    = 16 // pending login links; the oldest goes first
	maxSessions = 64
)

// sessions holds the pending login links and the live sessions, each by the
// SHA-256 of its secret: a lookup does not compare secrets byte by byte.
type sessions struct {
	mu       sync.Mutex
	links    map[[32]byte]time.Time // expiry
	sessions map[[32]byte]time.Time
	now      func() time.Time
}

func newSessions() *sessions {
	return &sessions{links: map[[32]byte]time.Time{}, sessions: map[[32]byte]time.Time{}, now: time.Now}
}

// newSecret is 32 random bytes, URL-safe.
func newSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails: crypto/rand panics rather
	return base64.RawURLEncoding.EncodeToString(b)
}

// add keeps a secret in m until ttl from now, dropping expired ones and, past
// limit, the one that expires first.
func (s *sessions) add(m map[[32]byte]time.Time, secret string, ttl time.Duration, limit int) {
	now := s.now()
	for k, exp := range m {
		if !now.Before(exp) {
			delete(m, k)
		}
	}
	for len(m) >= limit {
		var first [32]byte
		var at time.Time
		for k, exp := range m {
			if at.IsZero() || exp.Before(at) {
				first, at = k, exp
			}
		}
		delete(m, first)
	}
	m[sha256.Sum256([]byte(secret))] = now.Add(ttl)
}

// link makes a one-time login secret.
func (s *sessions) link() (string, time.Time) {
	secret := newSecret()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.add(s.links, secret, loginTTL, maxLinks)
	return secret, s.links[sha256.Sum256([]byte(secret))]
}

// redeem spends a login secret, once, before it expires, for a new session.
func (s *sessions) redeem(secret string) (session string, ok bool) {
	key := sha256.Sum256([]byte(secret))
	s.mu.Lock()
	defer s.mu.Unlock()
	exp, found := s.links[key]
	delete(s.links, key)
	if !found || !s.now().Before(exp) {
		return "", false
	}
	session = newSecret()
	s.add(s.sessions, session, sessionTTL, maxSessions)
	return session, true
}

// valid reports whether a session secret is live.
func (s *sessions) valid(secret string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	exp, ok := s.sessions[sha256.Sum256([]byte(secret))]
	return ok && s.now().Before(exp)
}

// cookieName is per port: a browser sends a host's cookies to all its ports, so
// two servers on one host must not take each other's.
func (s *Server) cookieName() string {
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(s.URL(), "http://"))
	return "bgtask_session_" + port
}

// guard runs every request through the checks, in order: the Host is this
// server's (a page on another name that resolves here is refused: DNS
// rebinding); no other origin's request (its Origin, or what the browser says
// of it in Sec-Fetch-Site) unless it is a top-level navigation, and no
// state-changing request from another origin at all (CrossOriginProtection);
// then the token or a session, except for the login link itself.
func (s *Server) guard(next http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, &api.Error{Code: 403, Field: "Origin", Message: "Origin: a state-changing request from another origin is refused"})
	}))
	authed := cop.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/login" && !s.authorized(r) {
			s.unauthorized(w, r)
			return
		}
		next.ServeHTTP(w, r)
	}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
		if err := s.checkOrigin(r); err != nil {
			s.fail(w, err)
			return
		}
		authed.ServeHTTP(w, r)
	})
}

// checkOrigin refuses a request to another Host, or from another origin.
func (s *Server) checkOrigin(r *http.Request) error {
	s.mu.Lock()
	own := s.hosts[strings.ToLower(r.Host)]
	s.mu.Unlock()
	if !own {
		return &api.Error{Code: 403, Field: "Host", Message: "Host: " + r.Host + " is not this server's address (DNS rebinding is refused); use " + s.URL()}
	}
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || u.Scheme != "http" || !strings.EqualFold(u.Host, r.Host) {
			return &api.Error{Code: 403, Field: "Origin", Message: "Origin: " + origin + " is not this server's; requests from other origins are refused"}
		}
	}
	site := r.Header.Get("Sec-Fetch-Site")
	if site != "" && site != "same-origin" && site != "none" && r.Header.Get("Sec-Fetch-Mode") != "navigate" {
		return &api.Error{Code: 403, Field: "Sec-Fetch-Site", Message: "Sec-Fetch-Site: " + site + ": only this server's own pages may call it"}
	}
	return nil
}

// authorized: the bearer token, compared in constant time, or a live session;
// for GET /metrics, the metrics token too.
func (s *Server) authorized(r *http.Request) bool {
	if token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		if r.Method == http.MethodGet && r.URL.Path == "/metrics" && s.cfg.MetricsToken != "" &&
			subtle.ConstantTimeCompare([]byte(token), []byte(s.cfg.MetricsToken)) == 1 {
			return true
		}
		return subtle.ConstantTimeCompare([]byte(token), []byte(s.cfg.Token)) == 1
	}
	c, err := r.Cookie(s.cookieName())
	return err == nil && s.sessions.valid(c.Value)
}

func (s *Server) unauthorized(w http.ResponseWriter, r *http.Request) {
	msg := "Authorization: give the bearer token of HOME/http.json, or log in with `bgtask ui`"
	if r.URL.Path == "/metrics" {
		msg = "Authorization: give the bearer token of HOME/metrics.token (or of HOME/http.json)"
	}
	if !strings.HasPrefix(r.URL.Path, "/v1/") && r.URL.Path != "/metrics" {
		s.page(w, http.StatusUnauthorized, "login.html", msg)
		return
	}
	s.fail(w, &api.Error{Code: 401, Field: "Authorization", Message: msg})
}

// loginLink makes a one-time login URL (what `bgtask ui` opens).
func (s *Server) loginLink(_ context.Context, _ *http.Request) (reply, error) {
	secret, exp := s.sessions.link()
	return reply{status: http.StatusCreated, body: struct {
		URL       string    `json:"url"`
		ExpiresAt time.Time `json:"expires_at"`
	}{s.URL() + "/login?token=" + secret, exp.UTC()}}, nil
}

// login spends a one-time link: a session cookie, then a page that goes on to
// the dashboard. Not a redirect: a browser sends no SameSite=Strict cookie along
// a chain of redirects that another site started (the page `bgtask ui` opens is
// a file), and the dashboard would ask to log in again; the page's own
// navigation is same-site.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	session, ok := s.sessions.redeem(r.URL.Query().Get("token"))
	if !ok {
		s.page(w, http.StatusUnauthorized, "login.html", "This login link was used already or has expired: run `bgtask ui` for a new one.")
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name: s.cookieName(), Value: session, Path: "/", MaxAge: int(sessionTTL / time.Second),
		HttpOnly: true, SameSite: http.SameSiteStrictMode,
	})
	s.page(w, http.StatusOK, "loggedin.html", nil)
}
