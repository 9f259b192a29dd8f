package faults

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Action is how a [Proxy] ends a connection.
type Action int

// Actions of a proxy on a connection.
const (
	// ActionCut closes both sides in order (FIN).
	ActionCut Action = iota
	// ActionReset aborts both sides (RST).
	ActionReset
)

// Proxy is a TCP proxy between PostgreSQL clients and a server that injects
// network faults: it stalls traffic, cuts or resets connections, black-holes
// them, and ends a connection right after a chosen client message reached
// the server, before the client hears the answer. It reads the client's side
// of the PostgreSQL protocol to find those messages. It is safe for
// concurrent use.
type Proxy struct {
	listener net.Listener
	target   string

	mu       sync.Mutex
	conns    map[*proxyConn]struct{}
	stalled  chan struct{} // closed on resume; nil when not stalled
	holed    bool
	triggers []*Trigger
	closed   bool
	wg       sync.WaitGroup

	// rate, when positive, caps each connection's client-to-server bytes
	// per second (see [Proxy.Throttle]).
	rate atomic.Int64
}

// Throttle caps the bytes each connection sends to the server at
// bytesPerSecond from now on, as a slow uplink would: small statements pass
// at once, a multi-megabyte one takes seconds. Zero lifts the cap.
func (p *Proxy) Throttle(bytesPerSecond int64) { p.rate.Store(bytesPerSecond) }

// NewProxy listens on a free loopback port and forwards every connection to
// target (host:port). Close stops it.
func NewProxy(target string) (*Proxy, error) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy: listen: %w", err)
	}
	p := &Proxy{listener: listener, target: target, conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.listener.Addr().String() }

// URL returns databaseURL with its host and port replaced by the proxy's.
func (p *Proxy) URL(databaseURL string) (string, error) {
	u, err := url.Parse(databaseURL)
	if err != nil {
		return "", fmt.Errorf("proxy: parse URL: %w", err)
	}
	u.Host = p.Addr()
	return u.String(), nil
}

// Stall stops forwarding in both directions, holding every byte, until
// [Proxy.Resume]: a network that pauses and then recovers without loss.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled == nil {
		p.stalled = make(chan struct{})
	}
}

// Resume ends a [Proxy.Stall]; held bytes flow on.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
}

// BlackHole drops every byte in both directions from now on, on the
// connections open now and on new ones (which never reach the server), until
// [Proxy.Heal]. Nobody is told: reads simply never return.
func (p *Proxy) BlackHole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holed = true
	for c := range p.conns {
		c.holed.Store(true)
	}
}

// Heal ends a [Proxy.BlackHole] for new connections. The connections that
// fell into it stay there, as after a silent NAT timeout, until
// [Proxy.Cut], [Proxy.Reset] or [Proxy.Close].
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holed = false
}

// Cut closes every open connection (FIN on both sides) and returns how many.
func (p *Proxy) Cut() int { return p.endAll(ActionCut) }

// Reset aborts every open connection (RST on both sides) and returns how
// many.
func (p *Proxy) Reset() int { return p.endAll(ActionReset) }

func (p *Proxy) endAll(action Action) int {
	p.mu.Lock()
	conns := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.end(action)
	}
	return len(conns)
}

// TriggerGap is the least time between two firings of one [Trigger], so
// that the retry of a statement whose answer was lost can get through, as
// it would on a network that fails now and then rather than always.
const TriggerGap = 250 * time.Millisecond

// Trigger ends connections right after a matching client message reached
// the server. See [Proxy.EndAfter].
type Trigger struct {
	match  string
	action Action

	mu    sync.Mutex
	left  int
	fired int
	last  time.Time
}

// Fired returns how many connections the trigger ended.
func (t *Trigger) Fired() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.fired
}

// take reserves one firing, if any is left.
func (t *Trigger) take() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.left == 0 || time.Since(t.last) < TriggerGap {
		return false
	}
	t.left--
	t.fired++
	t.last = time.Now()
	return true
}

// EndAfter arms a trigger for the next times client messages whose SQL
// starts with match (case-insensitive, after leading blanks): a simple
// query such as "commit", or the execution of a statement whose text
// matches, such as sqlc's "-- name: OutboxFinish". Firings are at least
// [TriggerGap] apart. Each forwards the message (through its Sync) to the
// server, waits for the server's first answer (up to a second), drops that
// answer and ends the connection with action. The server has then received
// all the message asked, and may have done it; the client never hears.
func (p *Proxy) EndAfter(match string, action Action, times int) *Trigger {
	t := &Trigger{match: strings.ToLower(match), action: action, left: times}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.triggers = append(p.triggers, t)
	return t
}

// fire returns the armed trigger that query fires, if any.
func (p *Proxy) fire(query string) *Trigger {
	p.mu.Lock()
	triggers := p.triggers
	p.mu.Unlock()
	lower := strings.ToLower(strings.TrimSpace(query))
	for _, t := range triggers {
		if strings.HasPrefix(lower, t.match) && t.take() {
			return t
		}
	}
	return nil
}

// Close stops listening and ends every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
	p.mu.Unlock()
	err := p.listener.Close()
	p.endAll(ActionCut)
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.listener.Accept()
		if err != nil {
			return
		}
		c := &proxyConn{proxy: p, client: client, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = client.Close()
			return
		}
		c.holed.Store(p.holed)
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			c.run()
		}()
	}
}

// waitStall blocks while the proxy is stalled, or until c ends.
func (p *Proxy) waitStall(c *proxyConn) {
	for {
		p.mu.Lock()
		stalled := p.stalled
		p.mu.Unlock()
		if stalled == nil {
			return
		}
		select {
		case <-stalled:
		case <-c.done:
			return
		}
	}
}

// proxyConn is one proxied connection.
type proxyConn struct {
	proxy  *Proxy
	client net.Conn
	server net.Conn // nil until dialled

	holed   atomic.Bool
	swallow atomic.Bool   // drop the server's bytes from now on
	replied chan struct{} // set with swallow; closed on the first dropped answer

	endOnce sync.Once
	done    chan struct{}
	mu      sync.Mutex
}

func (c *proxyConn) run() {
	defer func() {
		c.proxy.mu.Lock()
		delete(c.proxy.conns, c)
		c.proxy.mu.Unlock()
	}()
	if c.holed.Load() {
		// Accepted into a black hole: read and drop until ended.
		_, _ = io.Copy(io.Discard, c.client)
		c.end(ActionCut)
		return
	}
	server, err := net.DialTimeout("tcp", c.proxy.target, 5*time.Second)
	if err != nil {
		c.end(ActionReset)
		return
	}
	c.mu.Lock()
	c.server = server
	c.mu.Unlock()
	select {
	case <-c.done: // ended while dialling
		c.end(ActionCut)
		return
	default:
	}
	var wg sync.WaitGroup
	wg.Go(c.serverToClient)
	c.clientToServer()
	c.end(ActionCut)
	wg.Wait()
}

// end closes both sides once.
func (c *proxyConn) end(action Action) {
	c.endOnce.Do(func() {
		close(c.done)
		c.mu.Lock()
		server := c.server
		c.mu.Unlock()
		for _, conn := range []net.Conn{c.client, server} {
			if conn == nil {
				continue
			}
			if tcp, ok := conn.(*net.TCPConn); ok && action == ActionReset {
				_ = tcp.SetLinger(0)
			}
			_ = conn.Close()
		}
	})
}

// serverToClient forwards the server's bytes; when the server closes, so
// does the client's side (PostgreSQL closes a cancel request's connection
// without a word, and the client waits for that).
func (c *proxyConn) serverToClient() {
	defer c.end(ActionCut)
	buf := make([]byte, 64<<10)
	for {
		n, err := c.server.Read(buf)
		if n > 0 {
			c.proxy.waitStall(c)
			switch {
			case c.swallow.Load():
				c.mu.Lock()
				if c.replied != nil {
					close(c.replied)
					c.replied = nil
				}
				c.mu.Unlock()
			case c.holed.Load():
			default:
				if _, werr := c.client.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// clientToServer forwards the client's messages one by one, so that
// triggers see each.
func (c *proxyConn) clientToServer() {
	r := bufio.NewReaderSize(c.client, 64<<10)
	w := bufio.NewWriterSize(c.server, 64<<10)
	write := func(msg []byte) bool {
		c.proxy.waitStall(c)
		if c.holed.Load() {
			return true
		}
		if rate := c.proxy.rate.Load(); rate > 0 && len(msg) > 4<<10 {
			select {
			case <-time.After(time.Duration(int64(len(msg)) * int64(time.Second) / rate)):
			case <-c.done:
				return false
			}
		}
		if _, err := w.Write(msg); err != nil {
			return false
		}
		if r.Buffered() == 0 {
			return w.Flush() == nil
		}
		return true
	}
	// Startup: an untyped message; SSL and GSS encryption requests are
	// answered by the server with one byte and followed by another.
	for {
		msg, err := readUntyped(r)
		if err != nil || !write(msg) || w.Flush() != nil {
			return
		}
		if code := binary.BigEndian.Uint32(msg[4:8]); code != 80877103 && code != 80877104 {
			break
		}
	}
	statements := map[string]string{} // prepared statement name → SQL
	var firing *Trigger
	for {
		msg, err := readTyped(r)
		if err != nil {
			return
		}
		body := msg[5:]
		switch msg[0] {
		case 'Q':
			if t := c.proxy.fire(cstring(body)); t != nil {
				firing = t
			}
		case 'P':
			name, rest := splitCString(body)
			statements[name] = cstring(rest)
		case 'B':
			_, rest := splitCString(body)
			if t := c.proxy.fire(statements[cstring(rest)]); t != nil {
				firing = t
			}
		}
		if firing != nil && (msg[0] == 'Q' || msg[0] == 'S') {
			c.mu.Lock()
			replied := make(chan struct{})
			c.replied = replied
			c.mu.Unlock()
			c.swallow.Store(true)
			if !write(msg) || w.Flush() != nil {
				return
			}
			select {
			case <-replied:
			case <-time.After(time.Second):
			case <-c.done:
			}
			c.end(firing.action)
			return
		}
		if !write(msg) {
			return
		}
	}
}

func readUntyped(r *bufio.Reader) ([]byte, error) {
	var head [4]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(head[:])
	if n < 8 || n > 1<<20 {
		return nil, errors.New("proxy: bad startup message")
	}
	msg := make([]byte, n)
	copy(msg, head[:])
	_, err := io.ReadFull(r, msg[4:])
	return msg, err
}

func readTyped(r *bufio.Reader) ([]byte, error) {
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(head[1:])
	if n < 4 || n > 1<<30 {
		return nil, errors.New("proxy: bad message length")
	}
	msg := make([]byte, 1+n)
	copy(msg, head[:])
	_, err := io.ReadFull(r, msg[5:])
	return msg, err
}

// cstring returns the NUL-terminated string at the start of b.
func cstring(b []byte) string {
	s, _ := splitCString(b)
	return s
}

func splitCString(b []byte) (string, []byte) {
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return string(b), nil
	}
	return string(b[:i]), b[i+1:]
}
