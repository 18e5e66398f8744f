// Command pause is the pod sandbox ("pause") container of the real-node e2e
// sandbox, which has no registry to pull registry.k8s.io/pause from. Like
// that image's C program it holds the pod's namespaces and does nothing
// else: it blocks until SIGINT or SIGTERM and then exits 0. As PID 1 (a pod
// that shares its process namespace) it also reaps the orphans the kernel
// reparents to it, so they do not linger as zombies.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			fmt.Fprintf(os.Stderr, "pause: shutting down, got signal %v\n", sig)
			os.Exit(0)
		}
		if os.Getpid() == 1 {
			reap()
		}
	}
}

// reap waits for every child that has exited, without blocking.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
