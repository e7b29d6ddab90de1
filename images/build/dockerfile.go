package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// instr is one Dockerfile instruction after line continuations are joined.
type instr struct {
	line  int
	cmd   string // upper case: FROM, RUN, COPY, ...
	flags map[string][]string
	args  string // the rest of the line, flags removed
}

// stage is a FROM and the instructions up to the next FROM.
type stage struct {
	name  string // the AS name, or its index as a string
	from  string
	steps []instr
}

// parse reads the subset of the Dockerfile syntax that images/Dockerfile
// uses. Anything else is an error, so that the offline build never
// silently differs from `docker build`.
func parse(r io.Reader) ([]stage, error) {
	var stages []stage
	sc := bufio.NewScanner(r)
	n, start := 0, 0
	var buf strings.Builder
	flush := func() error {
		text := strings.TrimSpace(buf.String())
		buf.Reset()
		if text == "" {
			return nil
		}
		in, err := split(start, text)
		if err != nil {
			return err
		}
		switch in.cmd {
		case "FROM":
			f := strings.Fields(in.args)
			st := stage{name: fmt.Sprint(len(stages))}
			switch {
			case len(f) == 1:
			case len(f) == 3 && strings.EqualFold(f[1], "AS"):
				st.name = f[2]
			default:
				return fmt.Errorf("line %d: FROM wants `image [AS name]`", in.line)
			}
			st.from = f[0]
			stages = append(stages, st)
		case "RUN", "COPY", "ENV", "ARG", "WORKDIR", "USER", "ENTRYPOINT", "CMD", "EXPOSE", "LABEL":
			if len(stages) == 0 {
				// A global ARG only feeds FROM lines, which name fixed images here.
				return fmt.Errorf("line %d: %s before FROM", in.line, in.cmd)
			}
			stages[len(stages)-1].steps = append(stages[len(stages)-1].steps, in)
		default:
			return fmt.Errorf("line %d: %s is not supported by the offline builder", in.line, in.cmd)
		}
		return nil
	}
	for sc.Scan() {
		n++
		line := sc.Text()
		trim := strings.TrimSpace(line)
		if buf.Len() == 0 {
			if trim == "" || strings.HasPrefix(trim, "#") {
				continue
			}
			start = n
		} else if strings.HasPrefix(trim, "#") {
			continue // comments inside a continued instruction are dropped, as docker does
		}
		if strings.HasSuffix(line, `\`) {
			buf.WriteString(strings.TrimSuffix(line, `\`))
			buf.WriteByte(' ')
			continue
		}
		buf.WriteString(line)
		if err := flush(); err != nil {
			return nil, err
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if err := flush(); err != nil {
		return nil, err
	}
	if len(stages) == 0 {
		return nil, fmt.Errorf("no FROM")
	}
	return stages, nil
}

func split(line int, text string) (instr, error) {
	cmd, rest, _ := strings.Cut(text, " ")
	in := instr{line: line, cmd: strings.ToUpper(cmd), flags: map[string][]string{}}
	rest = strings.TrimSpace(rest)
	for strings.HasPrefix(rest, "--") {
		var f string
		f, rest, _ = strings.Cut(rest, " ")
		rest = strings.TrimSpace(rest)
		k, v, ok := strings.Cut(strings.TrimPrefix(f, "--"), "=")
		if !ok {
			return in, fmt.Errorf("line %d: flag %s wants a value", line, f)
		}
		in.flags[k] = append(in.flags[k], v)
	}
	in.args = rest
	return in, nil
}

// execForm decodes ["a", "b"]; the shell form is not used for ENTRYPOINT
// here because it would need /bin/sh in every image (pause has none).
func execForm(in instr) ([]string, error) {
	var v []string
	if err := json.Unmarshal([]byte(in.args), &v); err != nil {
		return nil, fmt.Errorf("line %d: %s wants the exec form [\"...\"]: %v", in.line, in.cmd, err)
	}
	return v, nil
}

// cacheMounts returns the targets of RUN --mount=type=cache,target=...
func cacheMounts(in instr) ([]string, error) {
	var targets []string
	for _, m := range in.flags["mount"] {
		kv := map[string]string{}
		for _, p := range strings.Split(m, ",") {
			k, v, _ := strings.Cut(p, "=")
			kv[k] = v
		}
		if kv["type"] != "cache" || kv["target"] == "" {
			return nil, fmt.Errorf("line %d: only --mount=type=cache,target=... is supported", in.line)
		}
		targets = append(targets, kv["target"])
	}
	for k := range in.flags {
		if k != "mount" {
			return nil, fmt.Errorf("line %d: RUN --%s is not supported", in.line, k)
		}
	}
	return targets, nil
}

// argDecl reads `ARG name[=default]`; hasDef is false without a default,
// and then the name is set only when the build passes a value. What the
// builder would expand differently from docker ($ in a default, several
// names on one line) is an error.
func argDecl(in instr) (name, def string, hasDef bool, err error) {
	name, def, hasDef = strings.Cut(in.args, "=")
	if name == "" || strings.ContainsAny(name, " \t\"'$") {
		return "", "", false, fmt.Errorf("line %d: ARG wants one name[=default]", in.line)
	}
	if len(def) >= 2 && def[0] == '"' && def[len(def)-1] == '"' {
		def = def[1 : len(def)-1]
	} else if strings.ContainsAny(def, " \t\"") {
		return "", "", false, fmt.Errorf("line %d: ARG %s: a default with spaces wants double quotes", in.line, name)
	}
	if strings.Contains(def, "$") {
		return "", "", false, fmt.Errorf("line %d: ARG %s: $ in a default is not supported", in.line, name)
	}
	return name, def, hasDef, nil
}
