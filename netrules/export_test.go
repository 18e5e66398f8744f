package netrules

// ParseRuleForTest exposes the rule parser to the external test package.
func ParseRuleForTest(line string) []string {
	r := parseRules([]string{line})
	if len(r) == 0 {
		return nil
	}
	return r[0].args
}
