package testing

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Packet is a new TCP connection's first packet, as the nat table sees it.
// Src and InIface are unset for a packet of the host itself (OUTPUT).
type Packet struct {
	Src     netip.Addr
	InIface string
	Dst     netip.AddrPort
	Mark    uint32
}

// Traverse walks p through the nat table from hook (PREROUTING or OUTPUT)
// the way the kernel does for the matches the agent and kube-proxy use
// (-s, -d, -i, !, -p tcp, --dport, mark, set, comment, statistic) and returns where a
// DNAT sends it, or "" if no DNAT applies. A statistic match is taken as
// matching, so the first of several kube-proxy endpoints wins. A rule with a
// match the fake does not model is an error, not a silent miss.
func (f *IPTables) Traverse(hook string, p Packet) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, err := f.chain("nat", hook)
	if err != nil {
		return "", err
	}
	to, _, err := f.walk(t, hook, p, 0)
	return to, err
}

// walk evaluates chain; done reports that a terminal verdict was reached.
func (f *IPTables) walk(t *table, chain string, p Packet, depth int) (to string, done bool, err error) {
	if depth > 32 {
		return "", false, fmt.Errorf("chain recursion too deep at %s", chain)
	}
	for _, r := range t.chains[chain] {
		args := splitRendered(r)
		ok, err := f.matches(args, p)
		if err != nil {
			return "", false, fmt.Errorf("%s: %q: %w", chain, r, err)
		}
		if !ok {
			continue
		}
		target, targs := targetOf(args)
		switch target {
		case "":
			continue
		case "RETURN":
			return "", false, nil
		case "SET":
			// Non-terminating; the fake does not record what it adds.
			continue
		case "ACCEPT":
			return "", true, nil
		case "DNAT":
			for i := 0; i+1 < len(targs); i++ {
				if targs[i] == "--to-destination" {
					return targs[i+1], true, nil
				}
			}
			return "", false, fmt.Errorf("DNAT without --to-destination: %q", r)
		default:
			if _, ok := t.chains[target]; !ok {
				return "", false, fmt.Errorf("unmodelled target %s", target)
			}
			to, done, err := f.walk(t, target, p, depth+1)
			if err != nil || done {
				return to, done, err
			}
		}
	}
	return "", false, nil
}

func (f *IPTables) matches(args []string, p Packet) (bool, error) {
	negate := false
	for i := 0; i < len(args); i++ {
		a := args[i]
		next := func() string {
			if i+1 < len(args) {
				i++
				return args[i]
			}
			return ""
		}
		// want is what the next test must find: false after "!".
		want := !negate
		negate = false
		switch a {
		case "!":
			negate = true
		case "-s":
			pfx, err := netip.ParsePrefix(next())
			if err != nil {
				return false, err
			}
			if pfx.Contains(p.Src) != want {
				return false, nil
			}
		case "-i":
			name := next()
			got := p.InIface == name || (strings.HasSuffix(name, "+") && p.InIface != "" && strings.HasPrefix(p.InIface, strings.TrimSuffix(name, "+")))
			if got != want {
				return false, nil
			}
		case "-m":
			next() // the match's own options follow and are handled below
		case "-j", "-g":
			return true, nil
		case "--comment":
			next()
		case "-p":
			if next() != "tcp" {
				return false, nil
			}
		case "-d":
			pfx, err := netip.ParsePrefix(next())
			if err != nil {
				return false, err
			}
			if !pfx.Contains(p.Dst.Addr()) {
				return false, nil
			}
		case "--dport":
			port, err := strconv.Atoi(next())
			if err != nil {
				return false, err
			}
			if uint16(port) != p.Dst.Port() {
				return false, nil
			}
		case "--mark":
			v, m, _ := strings.Cut(next(), "/")
			val, err := strconv.ParseUint(v, 0, 32)
			if err != nil {
				return false, err
			}
			mask := uint64(0xffffffff)
			if m != "" {
				if mask, err = strconv.ParseUint(m, 0, 32); err != nil {
					return false, err
				}
			}
			if uint64(p.Mark)&mask != val {
				return false, nil
			}
		case "--match-set":
			name := next()
			var addr netip.Addr
			switch dir := next(); dir {
			case "dst":
				addr = p.Dst.Addr()
			case "src":
				addr = p.Src
			case "dst,dst":
				// A hash:ip,port set matched on destination address
				// and port (kube-proxy's IPVS mode: KUBE-CLUSTER-IP).
				if (f.sets != nil && f.sets.ContainsAddrPort(name, p.Dst)) != want {
					return false, nil
				}
				continue
			default:
				return false, fmt.Errorf("unmodelled set direction %q", dir)
			}
			if (f.sets != nil && addr.IsValid() && f.sets.Contains(name, addr)) != want {
				return false, nil
			}
		case "--mode", "--probability":
			next()
		case "--add-set":
			// The SET target's options follow its -j: never reached.
			next()
			next()
		case "--exist":
		default:
			return false, fmt.Errorf("unmodelled option %q", a)
		}
	}
	return true, nil
}

func targetOf(args []string) (string, []string) {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "-j" || args[i] == "-g" {
			return args[i+1], args[i+2:]
		}
	}
	return "", nil
}

// splitRendered undoes render.
func splitRendered(r string) []string {
	var out []string
	var cur strings.Builder
	quoted, inWord := false, false
	for i := 0; i < len(r); i++ {
		c := r[i]
		switch {
		case quoted && c == '\\' && i+1 < len(r):
			i++
			cur.WriteByte(r[i])
		case c == '"':
			quoted, inWord = !quoted, true
		case !quoted && c == ' ':
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out
}
