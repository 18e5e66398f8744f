package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
)

// nsPrefix starts the name of every network namespace the sandbox creates,
// followed by the creating process's PID, so that namespaces left by a
// process that died are recognisable and removable.
const nsPrefix = "kac-"

// run executes a command and returns its combined output in the error.
func run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// output executes a command and returns its standard output.
func output(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return string(out), nil
}

// NetNS is a named network namespace created by the sandbox.
type NetNS string

// Name returns the namespace's name, as `ip netns` knows it.
func (n NetNS) Name() string { return string(n) }

// Run runs a command inside the namespace.
func (n NetNS) Run(ctx context.Context, args ...string) error {
	return run(ctx, "ip", append([]string{"netns", "exec", string(n)}, args...)...)
}

// Output runs a command inside the namespace and returns its output.
func (n NetNS) Output(ctx context.Context, args ...string) (string, error) {
	return output(ctx, "ip", append([]string{"netns", "exec", string(n)}, args...)...)
}

// DialContext dials from inside the namespace: the socket is created there
// and stays there. It lets this process, which lives in the machine's root
// namespace, talk to servers in the sandbox without touching the root
// namespace's routes.
func (n NetNS) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	var conn net.Conn
	err := n.do(func() error {
		var err error
		conn, err = d.DialContext(ctx, network, addr)
		return err
	})
	return conn, err
}

// Listen opens a listener inside the namespace.
func (n NetNS) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := n.do(func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// do runs fn on an OS thread switched into the namespace. The thread is
// switched back before it is released; if that fails, the thread stays
// locked and dies with its goroutine instead of serving others from the
// wrong namespace.
func (n NetNS) do(fn func() error) error {
	target, err := netns.GetFromName(string(n))
	if err != nil {
		return fmt.Errorf("opening netns %s: %w", n, err)
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(target); err != nil {
			errc <- fmt.Errorf("entering netns %s: %w", n, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- fmt.Errorf("leaving netns %s: %w", n, err)
			return // the thread stays locked and is discarded
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// createNetNS creates a namespace with loopback up.
func createNetNS(ctx context.Context, name string) (NetNS, error) {
	if err := run(ctx, "ip", "netns", "add", name); err != nil {
		return "", err
	}
	n := NetNS(name)
	if err := n.Run(ctx, "ip", "link", "set", "lo", "up"); err != nil {
		_ = deleteNetNS(name)
		return "", err
	}
	return n, nil
}

// deleteNetNS kills every process still inside the namespace, then deletes
// it. Deleting a namespace that is gone is not an error.
func deleteNetNS(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := os.Stat("/var/run/netns/" + name); os.IsNotExist(err) {
		return nil
	}
	if out, err := output(ctx, "ip", "netns", "pids", name); err == nil {
		for _, f := range strings.Fields(out) {
			if pid, err := strconv.Atoi(f); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	return run(ctx, "ip", "netns", "delete", name)
}

// CleanStale deletes sandbox namespaces whose creating process is gone: what
// a test binary killed with SIGKILL leaves behind.
func CleanStale() error {
	entries, err := os.ReadDir("/var/run/netns")
	if os.IsNotExist(err) {
		return nil
	} else if err != nil {
		return err
	}
	var errs []string
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), nsPrefix)
		if !ok {
			continue
		}
		pidStr, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if syscall.Kill(pid, 0) == nil {
			continue // its owner still runs
		}
		if err := deleteNetNS(e.Name()); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("cleaning stale namespaces: %s", strings.Join(errs, "; "))
	}
	return nil
}
