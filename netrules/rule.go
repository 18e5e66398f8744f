package netrules

import (
	"slices"
	"strings"
)

// parsedRule is one "-A CHAIN args..." line of `iptables -S` output, split
// into the chain and its arguments with iptables' quoting undone and packet
// counters ("-c PKTS BYTES", printed by some iptables-nft versions) dropped.
type parsedRule struct {
	chain string
	args  []string
}

// parseRules picks the rules out of `iptables -S CHAIN` output.
func parseRules(lines []string) []parsedRule {
	var out []parsedRule
	for _, l := range lines {
		f := splitQuoted(l)
		if len(f) < 2 || f[0] != "-A" {
			continue
		}
		out = append(out, parsedRule{chain: f[1], args: dropCounters(f[2:])})
	}
	return out
}

// target returns the rule's jump (-j) or goto (-g) target, or "".
func (r parsedRule) target() string {
	for i := 0; i+1 < len(r.args); i++ {
		if r.args[i] == "-j" || r.args[i] == "-g" {
			return r.args[i+1]
		}
	}
	return ""
}

// splitQuoted splits a line of iptables -S output into words. iptables
// double-quotes words containing anything but [A-Za-z0-9_./:-] and escapes
// '"' and '\' inside them with a backslash.
func splitQuoted(line string) []string {
	var out []string
	var cur strings.Builder
	inWord, quoted := false, false
	for i := 0; i < len(line); i++ {
		ch := line[i]
		switch {
		case quoted && ch == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
		case ch == '"':
			quoted = !quoted
			inWord = true
		case !quoted && (ch == ' ' || ch == '\t'):
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(ch)
			inWord = true
		}
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out
}

// dropCounters removes "-c PKTS BYTES" from a rule's arguments.
func dropCounters(args []string) []string {
	if i := slices.Index(args, "-c"); i >= 0 && i+2 < len(args) {
		return append(slices.Clone(args[:i]), args[i+3:]...)
	}
	return args
}
