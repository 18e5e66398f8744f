package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is a long-running program the sandbox started, with its output
// captured in a log file.
type Process struct {
	Name    string
	LogFile string
	cmd     *exec.Cmd
	done    chan struct{}

	mu  sync.Mutex // protects the field below
	err error      // exit status, once done is closed
}

// startProcess starts cmd with its output going to logFile. The process gets
// its own process group, and dies with the test binary (Pdeathsig).
func startProcess(name string, cmd *exec.Cmd, logFile string) (*Process, error) {
	f, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{Name: name, LogFile: logFile, cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		f.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// Pid returns the process ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited, and its error if so.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return true, p.err
	default:
		return false, nil
	}
}

// ExitCode returns the exit code once the process has exited, else -1.
func (p *Process) ExitCode() int {
	if done, _ := p.Exited(); !done {
		return -1
	}
	return p.cmd.ProcessState.ExitCode()
}

// Signal sends sig to the process.
func (p *Process) Signal(sig syscall.Signal) error {
	return p.cmd.Process.Signal(sig)
}

// Wait waits for the process to exit, at most timeout.
func (p *Process) Wait(timeout time.Duration) error {
	select {
	case <-p.done:
		_, err := p.Exited()
		return err
	case <-time.After(timeout):
		return fmt.Errorf("%s still running after %s", p.Name, timeout)
	}
}

// reapTimeout bounds the wait for a killed process to be reaped. A
// multi-threaded process whose leader has exited is reaped only once every
// thread has, and a thread stuck in the kernel (an unmount, a cgroup
// operation on a loaded machine) outlives SIGKILL; the teardown goes on
// without it rather than hang the run.
const reapTimeout = 30 * time.Second

// Stop sends SIGTERM, then SIGKILL to the process group after grace. It
// returns an error only when the killed process could not be reaped within
// reapTimeout.
func (p *Process) Stop(grace time.Duration) error {
	if done, _ := p.Exited(); done {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(reapTimeout):
		return fmt.Errorf("%s (pid %d) killed but not reaped after %s: a thread is stuck in the kernel (%s)",
			p.Name, p.cmd.Process.Pid, reapTimeout, threadStates(p.cmd.Process.Pid))
	}
}

// threadStates summarises the state and kernel wait channel of each of
// pid's threads, for the error of a process that cannot be reaped.
func threadStates(pid int) string {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, t := range tasks {
		stat, _ := os.ReadFile(filepath.Join(dir, t.Name(), "stat"))
		wchan, _ := os.ReadFile(filepath.Join(dir, t.Name(), "wchan"))
		state := "?"
		// The state follows the parenthesised command name.
		if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && i+2 < len(stat) {
			state = string(stat[i+2])
		}
		out = append(out, fmt.Sprintf("thread %s %s %s", t.Name(), state, strings.TrimSpace(string(wchan))))
		if len(out) == 8 {
			out = append(out, "...")
			break
		}
	}
	return strings.Join(out, "; ")
}

// Log returns the process's output so far.
func (p *Process) Log() string {
	b, _ := os.ReadFile(p.LogFile)
	return string(b)
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
