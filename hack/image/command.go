package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// run runs name with args in dir (the current directory if empty), with
// env appended to this process's environment, and returns its standard
// output. A failure's error names the command and carries its standard
// error on one line.
func run(ctx context.Context, dir string, env []string, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	if len(env) > 0 {
		cmd.Env = append(cmd.Environ(), env...)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, commandError(cmd, err, stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

func commandError(cmd *exec.Cmd, err error, stderr []byte) error {
	msg := fmt.Errorf("%s: %w", strings.Join(cmd.Args, " "), err)
	if out := oneLine(stderr); out != "" {
		msg = fmt.Errorf("%w: %s", msg, out)
	}
	return msg
}

// oneLine joins the non-empty lines of out with "; ", keeping the last
// 400 bytes: the end of a tool's output is where it says what went wrong.
func oneLine(out []byte) string {
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	s := strings.Join(lines, "; ")
	if len(s) > 400 {
		s = "..." + s[len(s)-400:]
	}
	return s
}
