package lockside_test

// Real processes for the tests: redis-server and the sidecar binary ($LOCKSIDE_BIN),
// on free loopback ports, stopped when the test ends (and killed with the test
// binary, through Pdeathsig, if it dies first). No mocks.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockside/lockside/clients/go"
)

// sidecarBin is a private copy of $LOCKSIDE_BIN, made once per run, so that a newer
// build dropped in its place mid-run does not mix versions.
var sidecarBin string

func TestMain(m *testing.M) {
	bin := os.Getenv("LOCKSIDE_BIN")
	if bin == "" {
		fmt.Fprintln(os.Stderr, "LOCKSIDE_BIN is not set: the tests need the sidecar binary (e.g. LOCKSIDE_BIN=$PWD/target/debug/lockside)")
		os.Exit(1)
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		fmt.Fprintln(os.Stderr, "redis-server is not installed: the tests need it")
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "lockside-go-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sidecarBin = filepath.Join(dir, "lockside")
	if err := copyFile(bin, sidecarBin); err != nil {
		fmt.Fprintln(os.Stderr, "copy LOCKSIDE_BIN:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// freePort is a loopback port nobody listened on a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// redisServer is a redis-server on a free port.
type redisServer struct {
	port int
	cmd  *exec.Cmd
}

func startRedis(t *testing.T) *redisServer {
	t.Helper()
	for attempt := 0; attempt < 5; attempt++ {
		port := freePort(t)
		cmd := command("redis-server", "--port", fmt.Sprint(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", t.TempDir())
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		r := &redisServer{port: port, cmd: cmd}
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if reply, err := r.do("PING"); err == nil && reply == "+PONG" {
				t.Cleanup(func() { cmd.Process.Kill(); <-exited })
				return r
			}
			select {
			case <-exited: // the port was taken meanwhile: another one
				deadline = time.Time{}
			case <-time.After(10 * time.Millisecond):
			}
		}
		cmd.Process.Kill()
		<-exited
	}
	t.Fatal("redis-server did not start")
	return nil
}

func (r *redisServer) url() string { return fmt.Sprintf("redis://127.0.0.1:%d", r.port) }

// do sends one command and returns the first line of the reply.
func (r *redisServer) do(args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", r.port), time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	return strings.TrimRight(line, "\r\n"), err
}

// sidecar is a `lockside serve` process; kill and start it again on the same address.
type sidecar struct {
	t     *testing.T
	store string
	extra []string
	addr  string

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	logTail []string
}

var listening = regexp.MustCompile(`listening address=(\S+)`)

// startSidecar starts the sidecar on a free port with store ("memory" or a Redis
// URL). The attachment TTL is the smallest allowed, so that a killed sidecar's
// sessions can be resumed 600 ms after it died.
func startSidecar(t *testing.T, store string, extra ...string) *sidecar {
	t.Helper()
	s := &sidecar{t: t, store: store, extra: extra, addr: "127.0.0.1:0"}
	s.start()
	t.Cleanup(func() {
		s.kill()
		if t.Failed() {
			s.mu.Lock()
			t.Logf("sidecar log (last lines):\n%s", strings.Join(s.logTail, "\n"))
			s.mu.Unlock()
		}
	})
	return s
}

func (s *sidecar) start() {
	s.t.Helper()
	args := append([]string{"serve", "--listen", s.addr, "--admin-listen", "none",
		"--store", s.store, "--attachment-ttl", "600ms"}, s.extra...)
	cmd := command(sidecarBin, args...)
	cmd.Env = append(os.Environ(), "NO_COLOR=1", "RUST_LOG=info")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	exited := make(chan struct{})
	bound := make(chan string, 1)
	go func() {
		scan := bufio.NewScanner(stderr)
		for scan.Scan() {
			line := scan.Text()
			s.mu.Lock()
			s.logTail = append(s.logTail, line)
			if len(s.logTail) > 60 {
				s.logTail = s.logTail[1:]
			}
			s.mu.Unlock()
			if m := listening.FindStringSubmatch(line); m != nil {
				select {
				case bound <- m[1]:
				default:
				}
			}
		}
		cmd.Wait()
		close(exited)
	}()
	select {
	case addr := <-bound:
		s.mu.Lock()
		s.addr, s.cmd, s.exited = addr, cmd, exited
		s.mu.Unlock()
	case <-exited:
		s.t.Fatalf("the sidecar exited at start:\n%s", strings.Join(s.logTail, "\n"))
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		s.t.Fatal("the sidecar did not say where it listens within 10 s")
	}
}

// kill SIGKILLs the sidecar and waits until it is gone.
func (s *sidecar) kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Kill()
	<-exited
}

func (s *sidecar) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		s.cmd.Process.Signal(sig)
	}
}

// proxy is a TCP relay in front of the sidecar whose connections the test can reset:
// a connection that breaks while both ends stay alive.
type proxy struct {
	addr    string
	ln      net.Listener
	mu      sync.Mutex
	conns   []net.Conn
	backend string
}

func startProxy(t *testing.T, backend string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{addr: ln.Addr().String(), ln: ln, backend: backend}
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", backend)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			go func() { io.Copy(out, in); out.Close() }()
			go func() { io.Copy(in, out); in.Close() }()
		}
	}()
	t.Cleanup(func() { ln.Close(); p.reset() })
	return p
}

// reset ends every relayed connection with a TCP reset, on both sides.
func (p *proxy) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.Close()
	}
	p.conns = nil
}

// awaitState waits until lock is in state want, failing the test after timeout. It
// follows Changed, so it sees the state as soon as it changes (no polling).
func awaitState(t *testing.T, l *lockside.Lock, want lockside.LockState, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		changed := l.Changed()
		got := l.State()
		if got == want {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatalf("the lock is %s after %v, want %s", got, timeout, want)
		}
	}
}
