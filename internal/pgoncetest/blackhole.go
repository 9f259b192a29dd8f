package pgoncetest

import (
	"context"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// BlackHoleProxy forwards TCP connections from 127.0.0.1 to the test
// database. On command it black-holes the connections open at that moment:
// it keeps their sockets open but forwards nothing more either way, as a
// server that vanished without closing them would (a half-open connection).
// Connections opened later are forwarded as usual.
type BlackHoleProxy struct {
	listener net.Listener
	target   string

	mu    sync.Mutex
	links []*proxyLink
	wg    sync.WaitGroup
}

// proxyLink is one proxied connection.
type proxyLink struct {
	client, server net.Conn
	blackHoled     atomic.Bool
}

// NewBlackHoleProxy starts a proxy that closes when tb ends, and returns a
// pool over it of at most maxConns connections, closed when tb ends just
// after the proxy (so that a statement stuck on a black-holed connection
// ends first).
func NewBlackHoleProxy(tb testing.TB, maxConns int32) (*BlackHoleProxy, *pgxpool.Pool) {
	tb.Helper()
	config, err := pgxpool.ParseConfig(DatabaseURL(tb))
	if err != nil {
		tb.Fatalf("parse database url: %v", err)
	}
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("listen: %v", err)
	}
	p := &BlackHoleProxy{
		listener: listener,
		target:   net.JoinHostPort(config.ConnConfig.Host, strconv.Itoa(int(config.ConnConfig.Port))),
	}
	p.wg.Add(1)
	go p.accept()

	addr := listener.Addr().(*net.TCPAddr)                                               //nolint:forcetypeassert // a TCP listener
	config.ConnConfig.Host, config.ConnConfig.Port = addr.IP.String(), uint16(addr.Port) //nolint:gosec // a port
	config.ConnConfig.Fallbacks = nil
	config.ConnConfig.RuntimeParams["search_path"] = ""
	config.MaxConns = maxConns
	// A connection being opened when the hole opens would otherwise wait
	// for its handshake forever, holding a pool slot.
	config.ConnConfig.ConnectTimeout = 5 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, config)
	if err != nil {
		p.Close()
		tb.Fatalf("connect through the proxy: %v", err)
	}
	tb.Cleanup(pool.Close)
	tb.Cleanup(p.Close)
	return p, pool
}

// BlackHole stops forwarding on every connection open now.
func (p *BlackHoleProxy) BlackHole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, link := range p.links {
		link.blackHoled.Store(true)
	}
}

func (p *BlackHoleProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.listener.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		link := &proxyLink{client: client, server: server}
		p.mu.Lock()
		p.links = append(p.links, link)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pump(link, server, client)
		go p.pump(link, client, server)
	}
}

// pump copies src to dst until either closes, dropping what it reads once
// the link is black-holed.
func (p *BlackHoleProxy) pump(link *proxyLink, dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		_ = link.client.Close()
		_ = link.server.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !link.blackHoled.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Close closes the proxy and every connection through it.
func (p *BlackHoleProxy) Close() {
	_ = p.listener.Close()
	p.mu.Lock()
	for _, link := range p.links {
		_ = link.client.Close()
		_ = link.server.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
