package proxy

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/pgonce/pgonce/outbox"
)

// Delivery says how a call of a side-effecting tool whose outcome is unknown
// (the proxy was killed between sending it and recording the answer) is made
// certain. It is spelled in the configuration file as its string.
type Delivery string

const (
	// DeliveryAtMostOnce is for an upstream that does not honour the key it
	// is sent: an uncertain call is never sent again, and goes to review
	// ([outbox.AtMostOnce]). The default, because it is the safe one.
	DeliveryAtMostOnce Delivery = "at_most_once"
	// DeliveryByKey is for an upstream that deduplicates on the key it
	// finds in the request's _meta: an uncertain call is sent again with the
	// same key ([outbox.IdempotentByKey]).
	DeliveryByKey Delivery = "by_key"
)

// outbox returns the delivery's pgonce delivery.
func (d Delivery) outbox() (outbox.Delivery, error) {
	switch d {
	case DeliveryAtMostOnce, "":
		return outbox.AtMostOnce, nil
	case DeliveryByKey:
		return outbox.IdempotentByKey, nil
	default:
		return 0, fmt.Errorf("%w: delivery must be %q or %q, got %q", ErrInvalidConfig, DeliveryByKey, DeliveryAtMostOnce, string(d))
	}
}

// Anonymous says what the proxy does with a call of a side-effecting tool
// whose _meta names no action (neither a key nor a run and a step).
type Anonymous string

const (
	// AnonymousRefuse answers it with a JSON-RPC invalid-params error that
	// says what to send; nothing is forwarded. The default.
	AnonymousRefuse Anonymous = "refuse"
	// AnonymousPassThrough forwards it as if there were no proxy: at least
	// once per request.
	AnonymousPassThrough Anonymous = "pass_through"
)

// Duration is a [time.Duration] written in the configuration file as a
// string that [time.ParseDuration] reads: "45s", "2m".
type Duration time.Duration

// UnmarshalJSON reads a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration is a string such as \"30s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes a duration string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// Upstream names the one MCP server the proxy forwards to: a command it
// starts and speaks to over stdio, or a streamable-HTTP URL. Exactly one of
// Command and URL is set.
type Upstream struct {
	// Command is the program to start, found on the PATH when it has no
	// slash; Args are its arguments.
	Command string   `json:"command,omitempty"`
	Args    []string `json:"args,omitempty"`
	// Env adds variables to the proxy's own environment for the command.
	Env map[string]string `json:"env,omitempty"`
	// Dir is the command's working directory. Defaults to the proxy's.
	Dir string `json:"dir,omitempty"`

	// URL is the streamable-HTTP endpoint of the upstream.
	URL string `json:"url,omitempty"`
	// HeaderEnv sets HTTP headers of every request to URL from environment
	// variables: header name to variable name, so that a credential never
	// sits in the file. A client's own Authorization header, when the proxy
	// serves HTTP, replaces the one set here for its calls.
	HeaderEnv map[string]string `json:"header_env,omitempty"`
}

// Tool configures one of the upstream's tools, by its MCP name.
type Tool struct {
	// Delivery is how an uncertain call of the tool is made certain.
	// Defaults to [DeliveryAtMostOnce].
	Delivery Delivery `json:"delivery,omitempty"`
	// ReadOnly overrides the tool's readOnlyHint annotation: true passes its
	// calls straight through, false runs them through pgonce even though the
	// upstream says the tool only reads. Defaults to the annotation.
	ReadOnly *bool `json:"read_only,omitempty"`
	// Name is the name the tool's keys carry in pgonce (the console, the
	// CLI, flow control), for an MCP name that is not a pgonce tool name
	// (^[a-z][a-z0-9_.:-]{0,63}$). Defaults to the MCP name, lower-cased
	// with every other character replaced by an underscore.
	Name string `json:"name,omitempty"`
}

// Config is the proxy's configuration, as its file holds it in JSON:
//
//	{
//	  "upstream": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"]},
//	  "schema": "pgonce",
//	  "tools": {
//	    "create_entities": {"delivery": "at_most_once"},
//	    "refund": {"delivery": "by_key"}
//	  }
//	}
//
// Every tool of the upstream that is not read-only runs through pgonce,
// at most once unless configured by key. Its zero value, with an upstream,
// works.
type Config struct {
	// Upstream is the MCP server the proxy forwards to. Required.
	Upstream Upstream `json:"upstream"`

	// DatabaseURLEnv names the environment variable that holds the
	// PostgreSQL URL, so that the password never sits in the file.
	// Defaults to PGONCE_DATABASE_URL, then DATABASE_URL.
	DatabaseURLEnv string `json:"database_url_env,omitempty"`
	// Schema is pgonce's schema, migrated beforehand (pgonce migrate).
	// Defaults to "pgonce".
	Schema string `json:"schema,omitempty"`

	// Tools configures tools by their MCP name. A tool not named here is
	// read-only by its annotation or else [DeliveryAtMostOnce].
	Tools map[string]Tool `json:"tools,omitempty"`

	// Anonymous says what to do with a call of a side-effecting tool that
	// names no action in its _meta. Defaults to [AnonymousRefuse].
	Anonymous Anonymous `json:"anonymous,omitempty"`

	// CallTimeout bounds one upstream call; Lease is how long a call holds
	// its key before the reconciler may settle it. Default to
	// [outbox.Config]'s: 30s and CallTimeout + 30s.
	CallTimeout Duration `json:"call_timeout,omitempty"`
	Lease       Duration `json:"lease,omitempty"`

	// ReconcileEvery is how often the proxy's reconciler settles the calls
	// a killed proxy left in flight, by each tool's delivery. Defaults to
	// 30s; "-1s" turns it off, for a deployment that runs
	// `pgonce reconcile` itself.
	ReconcileEvery Duration `json:"reconcile_every,omitempty"`
	// ReconcileGrace is how long past its lease a call waits before the
	// reconciler settles it. Defaults to reconcile.GraceDefault.
	ReconcileGrace Duration `json:"reconcile_grace,omitempty"`
}

// ReconcileEveryDefault is the default of [Config.ReconcileEvery].
const ReconcileEveryDefault = 30 * time.Second

// toolNamePattern is pgonce's rule for tool names (outbox.Call.Tool).
var toolNamePattern = regexp.MustCompile(`^[a-z][a-z0-9_.:-]{0,63}$`)

// ParseConfig reads a configuration from its JSON and validates it. It
// returns an error matching [ErrInvalidConfig] for JSON that is not a
// configuration (unknown fields included) or a configuration that cannot run.
func ParseConfig(data []byte) (Config, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var c Config
	if err := dec.Decode(&c); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if dec.More() {
		return Config{}, fmt.Errorf("%w: more than one JSON value", ErrInvalidConfig)
	}
	if err := c.validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// LoadConfig reads the configuration file at path ([ParseConfig]).
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path) //nolint:gosec // the operator names the file
	if err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// validate says what cannot run, naming the field and the rule.
func (c Config) validate() error {
	var errs []error
	switch {
	case c.Upstream.Command == "" && c.Upstream.URL == "":
		errs = append(errs, errors.New("upstream needs a command or a url"))
	case c.Upstream.Command != "" && c.Upstream.URL != "":
		errs = append(errs, errors.New("upstream has a command and a url: set one"))
	case c.Upstream.URL != "" && (len(c.Upstream.Args) > 0 || len(c.Upstream.Env) > 0 || c.Upstream.Dir != ""):
		errs = append(errs, errors.New("upstream args, env and dir go with a command, not a url"))
	case c.Upstream.Command != "" && len(c.Upstream.HeaderEnv) > 0:
		errs = append(errs, errors.New("upstream header_env goes with a url, not a command"))
	}
	if c.Upstream.URL != "" && !strings.HasPrefix(c.Upstream.URL, "http://") && !strings.HasPrefix(c.Upstream.URL, "https://") {
		errs = append(errs, fmt.Errorf("upstream url must begin with http:// or https://, got %q", c.Upstream.URL))
	}
	for name, tool := range c.Tools {
		if _, err := tool.Delivery.outbox(); err != nil {
			errs = append(errs, fmt.Errorf("tools[%q]: %w", name, err))
		}
		if tool.Name != "" && !toolNamePattern.MatchString(tool.Name) {
			errs = append(errs, fmt.Errorf("tools[%q].name must match %s, got %q", name, toolNamePattern, tool.Name))
		}
	}
	switch c.Anonymous {
	case "", AnonymousRefuse, AnonymousPassThrough:
	default:
		errs = append(errs, fmt.Errorf("anonymous must be %q or %q, got %q", AnonymousRefuse, AnonymousPassThrough, string(c.Anonymous)))
	}
	for field, d := range map[string]Duration{"call_timeout": c.CallTimeout, "lease": c.Lease, "reconcile_grace": c.ReconcileGrace} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative, got %s", field, time.Duration(d)))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// pgonceName returns the name under which the tool named mcpName is known
// to pgonce: the configured one, or the MCP name made a pgonce tool name.
func (c Config) pgonceName(mcpName string) string {
	if name := c.Tools[mcpName].Name; name != "" {
		return name
	}
	return sanitizeToolName(mcpName)
}

// sanitizeToolName makes an MCP tool name a pgonce tool name: lower case,
// every other character an underscore, a letter first, at most 64 bytes.
func sanitizeToolName(name string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_', r == '.', r == ':', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	s := b.String()
	if s == "" || s[0] < 'a' || s[0] > 'z' {
		s = "t_" + s
	}
	if len(s) > 64 {
		s = s[:64]
	}
	return s
}

// OutboxConfig returns the config of the pgonce client a proxy runs over:
// the schema, the call timeout and the lease, and an empty registry for the
// proxy's tools.
func (c Config) OutboxConfig() outbox.Config {
	return outbox.Config{
		Schema:      cmp.Or(c.Schema, SchemaDefault),
		Registry:    outbox.NewRegistry(),
		CallTimeout: time.Duration(c.CallTimeout),
		Lease:       time.Duration(c.Lease),
	}
}

// DatabaseURL returns the PostgreSQL URL from the environment variable the
// config names ([Config.DatabaseURLEnv]), else PGONCE_DATABASE_URL, else
// DATABASE_URL. It returns an error matching [ErrInvalidConfig] when the
// variable is unset or empty.
func (c Config) DatabaseURL() (string, error) {
	names := []string{"PGONCE_DATABASE_URL", "DATABASE_URL"}
	if c.DatabaseURLEnv != "" {
		names = []string{c.DatabaseURLEnv}
	}
	for _, name := range names {
		if url := os.Getenv(name); url != "" {
			return url, nil
		}
	}
	return "", fmt.Errorf("%w: no database URL: set $%s", ErrInvalidConfig, strings.Join(names, " or $"))
}

// SchemaDefault is the default of [Config.Schema].
const SchemaDefault = "pgonce"
