package netrules

import "strings"

// Rule is one iptables rule: the table and chain it lives in and its
// arguments, exactly as they would follow `iptables -t Table -A Chain`.
type Rule struct {
	Table string
	Chain string
	Args  []string
}

// String renders the rule as a line of iptables-save output.
func (r Rule) String() string {
	return "-A " + r.Chain + " " + strings.Join(quoteArgs(r.Args), " ")
}

// quoteArgs quotes arguments with spaces the way iptables-save prints them,
// so that rendered rules compare equal to what the kernel reports.
func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"") {
			out[i] = `"` + strings.ReplaceAll(a, `"`, `\"`) + `"`
		} else {
			out[i] = a
		}
	}
	return out
}

// jumpTarget returns the target of an iptables -S rule line ("-A C ... -j T"),
// or "" if it has none.
func jumpTarget(line string) string {
	f := strings.Fields(line)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "-j" || f[i] == "-g" {
			return f[i+1]
		}
	}
	return ""
}

// ruleLines filters the "-A" lines out of `iptables -S CHAIN` output.
func ruleLines(lines []string) []string {
	var out []string
	for _, l := range lines {
		if strings.HasPrefix(l, "-A ") {
			out = append(out, l)
		}
	}
	return out
}
