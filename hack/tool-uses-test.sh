#!/usr/bin/env bash
# Checks that every program the scripts run is one they obtained (issue 32: `make demo` once ran
# helm, which only `make chart` built: "helm: command not found" on a fresh machine, while CI,
# whose tools cache held helm, stayed green). Run by `make lint`. It reads hack/*.sh, .ci/run and
# the Makefile's recipes (parsed by shfmt, built like the other tools) and fails when
#   - a tool of hack/lib.sh's TOOLS (the Go tools, Debian packages, the workspace's binaries) is
#     run, by name or by a path ending in its name, before the same file (for the Makefile: the
#     same recipe) obtains it with need_tool, have_tool or tool_path (hack/lib.sh) or
#     hack/tool.sh; "before" is in the text, so a wrapper function that obtains its tool on its
#     own line (kubectl() { need_tool kubectl; ... }) covers the calls below it;
#   - a program is run that TOOLS does not list and that is not in every Debian install (BASE
#     below), a prerequisite (Go, Rust, make, python3), a function or a script of this repo: a new
#     tool is declared in TOOLS, saying how a fresh machine gets it;
#   - a tool's cache path is made by hand ($TOOLS_DIR, tool_dir, hack/build-tools.sh outside
#     hack/lib.sh, or a Debian package installed around need_tool: ensure_cmd, apt-get).
# What it cannot see: a program run through a variable not ending in a tool's name, and a use on a
# path where the obtain above it is skipped; the CI step of .ci/run (an empty tools cache for the
# tools that build in about a minute each) runs the real thing.
# It first checks itself on small scripts with known faults, so it can never pass by seeing nothing.
#
# Usage: hack/tool-uses-test.sh [file...]   (default: hack/*.sh .ci/run Makefile)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOG_TAG=tool-uses
# shellcheck source=SCRIPTDIR/lib.sh
. "$REPO/hack/lib.sh"
cd "$REPO"
SHFMT=$(tool_path shfmt)
export SHFMT
TOOL_NAMES=$(tool_names | tr '\n' ' ')
export TOOL_NAMES

check() { python3 - "$@" <<'PY'
import json, os, re, subprocess, sys

TOOLS = set(os.environ["TOOL_NAMES"].split())
# In every Debian install (Essential: yes, or bash's own), or a prerequisite of README.md.
BASE = set("""
. : [ [[ alias awk base64 basename bash break builtin cat cd chmod chown chroot cmp comm command
continue cp cut date dd declare df diff dirname du echo env eval exec exit export false find
flock getconf grep gzip head hostname id install kill ldd let ln local ls mapfile mkdir mkfifo
mktemp mount mv nice nohup nproc od printf pwd read readarray readlink readonly realpath return
rm rmdir sed seq set setsid sha256sum shift shopt sleep sort source split stat sync tac tail tar
tee test time timeout touch tr trap true type uname umask umount uniq unset wait wc xargs yes
runuser lscpu apt-get dpkg dpkg-query
go cargo make python3 git
""".split())
# Wrappers: the program they run is the argument after this many (options skipped as said).
WRAPPERS = {"exec": 0, "command": 0, "time": 0, "nohup": 0, "nice": 0, "setsid": 0, "env": 0,
            "timeout": 1, "runuser": None, "xargs": 0,
            # hack/lib.sh and the scripts' own
            "start_daemon": 2, "wait_for": 3, "quiet": 0, "as_pg": 0, "watch_build": 3,
            "start": 1, "timed.sh": 1}
OBTAIN = {"need_tool", "have_tool", "tool_path"}
# May build a tool's path or install a package by hand: the one path itself, and the hash test;
# and the builder of the previous release's cache entry (its own kind of tool, not in TOOLS).
HAND_OK = {"hack/lib.sh", "hack/build-tools.sh", "hack/versions.sh", "hack/tools-test.sh",
           "hack/previous-release.sh"}

errors = []

def shfmt_json(text, name):
    p = subprocess.run([os.environ["SHFMT"], "-ln", "bash", "--to-json"], input=text.encode(),
                       capture_output=True)
    if p.returncode != 0:
        errors.append(f"{name}: shfmt cannot parse it: {p.stderr.decode().strip()}")
        return None
    return json.loads(p.stdout)

def word(w):
    """A word as text: literal parts as written, expansions as $NAME / $(...)."""
    out = []
    for p in w.get("Parts", []):
        t = p.get("Type")
        if t in ("Lit", "SglQuoted"):
            out.append(p.get("Value", ""))
        elif t == "DblQuoted":
            out.append(word(p))
        elif t == "ParamExp":
            out.append("$" + p.get("Param", {}).get("Value", "?"))
        else:
            out.append("$(...)")
    return "".join(out)

def static(w):
    return all(p.get("Type") in ("Lit", "SglQuoted") or
               (p.get("Type") == "DblQuoted" and static(p)) for p in w.get("Parts", []))

def walk(n, fn):
    if isinstance(n, dict):
        fn(n)
        for v in n.values():
            walk(v, fn)
    elif isinstance(n, list):
        for v in n:
            walk(v, fn)

def functions(tree):
    names = set()
    walk(tree, lambda n: n.get("Type") == "FuncDecl" and names.add(n["Name"]["Value"]))
    return names

def command_of(args):
    """(index of the program's word, its text) after wrappers, or None."""
    i = 0
    while i < len(args):
        w = word(args[i])
        if "/" in w and w.rsplit("/", 1)[1] in WRAPPERS:
            w = w.rsplit("/", 1)[1]      # hack/timed.sh <stage> <command...>
        if w not in WRAPPERS:
            return i, word(args[i])
        if w == "command" and i + 1 < len(args) and word(args[i + 1]) in ("-v", "-V"):
            return None            # a look-up, not a run
        skip = WRAPPERS[w]
        i += 1
        if skip is None:           # runuser ... -- program
            while i < len(args) and word(args[i]) != "--":
                i += 1
            i += 1
            continue
        while i < len(args) and (word(args[i]).startswith("-") or
                                 (w == "env" and "=" in word(args[i]))):
            i += 1
        i += skip
    return None

def check_unit(name, tree, lines, own_funcs, lib_funcs):
    """lines: maps the parsed text's line numbers to the file's."""
    obtained = {}                  # tool -> first line obtaining it
    uses = []                      # (line, tool, how)
    def where(n):
        return lines(n["Pos"]["Line"])
    def visit(n):
        t = n.get("Type")
        if t != "CallExpr" or not n.get("Args"):
            return
        args = n["Args"]
        line = where(n)
        texts = [word(a) for a in args]
        # The obtain steps.
        if texts[0] in OBTAIN or texts[0].endswith("hack/tool.sh"):
            for a in texts[1:]:
                if a in TOOLS:
                    obtained.setdefault(a, line)
                elif a not in ("--release", "$@") and not a.startswith("$"):
                    errors.append(f"{name}:{line}: {texts[0]} {a}: not a tool of TOOLS (hack/lib.sh)")
            return
        if name not in HAND_OK:
            if texts[0].endswith("build-tools.sh") and not (name.endswith("Makefile:tools") and len(texts) == 1):
                errors.append(f"{name}:{line}: runs hack/build-tools.sh: obtain tools with need_tool (hack/lib.sh) or hack/tool.sh")
            if texts[0] in ("ensure_cmd", "apt-get"):
                errors.append(f"{name}:{line}: {texts[0]}: Debian tools come through need_tool (TOOLS in hack/lib.sh)")
        c = command_of(args)
        if c is None:
            return
        i, prog = c
        if prog in TOOLS:
            uses.append((line, prog, prog))
            # `kubectl singleton ...` runs the plugin kubectl-singleton.
            if prog == "kubectl" and i + 1 < len(args) and word(args[i + 1]) == "singleton":
                uses.append((line, "kubectl-singleton", "kubectl singleton"))
            return
        if not static(args[i]):
            tail = prog.rsplit("/", 1)[-1]
            if "/" in prog and tail in TOOLS:
                uses.append((line, tail, prog))
            return
        if prog.startswith("MAKEVAR_"):
            errors.append(f"{name}:{line}: runs $({prog[8:]}): a Make variable, not a path obtained "
                          "in the recipe (tool=$$(hack/tool.sh NAME))")
            return
        if (prog in BASE or prog in own_funcs or prog in lib_funcs or "/" in prog
                or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", prog)):
            return
        errors.append(f"{name}:{line}: runs {prog}, which hack/lib.sh's TOOLS does not list (how does "
                      "a fresh machine get it?) and which is not in every Debian install (BASE in "
                      "hack/tool-uses-test.sh)")
    walk(tree, visit)
    for line, tool, how in uses:
        first = obtained.get(tool)
        if first is None or first > line:
            errors.append(f"{name}:{line}: runs {how} without obtaining it first "
                          f"(need_tool {tool}, or hack/tool.sh {tool} in make)")

def hand_paths(name, text, first_line=1):
    if name in HAND_OK or name == "hack/tool-uses-test.sh":   # its self-test names TOOLS_DIR
        return
    for k, l in enumerate(text.split("\n")):
        code = l.split("#", 1)[0] if not l.lstrip().startswith("#") else ""
        if re.search(r"\bTOOLS_DIR\b|\btool_dir\b", code):
            errors.append(f"{name}:{first_line + k}: builds a tool's path by hand: use tool_path "
                          "(hack/lib.sh) or hack/tool.sh")

def lib_functions():
    names = set()
    for f in ("hack/lib.sh", "hack/versions.sh"):
        tree = shfmt_json(open(f).read(), f)
        names |= functions(tree) if tree else set()
    return names

def check_script(path, lib_funcs, text=None):
    text = open(path).read() if text is None else text
    tree = shfmt_json(text, path)
    if tree is None:
        return
    check_unit(path, tree, lambda l: l, functions(tree), lib_funcs)
    hand_paths(path, text)

MAKE_VARS = {"MAKE": "make"}

def make_expand(s):
    """A Makefile recipe line as the shell sees it: a variable whose value is plain text (CARGO ?=
    cargo) replaced by it, other references of make's made visible (MAKEVAR_NAME)."""
    out, i = [], 0
    while i < len(s):
        if s.startswith("$$", i):
            out.append("$"); i += 2
        elif s[i] == "$" and i + 1 < len(s) and s[i + 1] in "({":
            close = ")" if s[i + 1] == "(" else "}"
            depth, j = 0, i + 1
            while j < len(s):
                if s[j] in "({":
                    depth += 1
                elif s[j] in ")}":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            inner = s[i + 2:j]
            if inner in MAKE_VARS:
                out.append(MAKE_VARS[inner])
            elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", inner):
                out.append("MAKEVAR_" + inner)
            else:
                out.append("MAKEFN")
            i = j + 1
        elif s[i] == "$" and i + 1 < len(s):
            out.append("MAKEAUTO"); i += 2
        else:
            out.append(s[i]); i += 1
    return "".join(out)

def check_makefile(path, lib_funcs):
    src = open(path).read().split("\n")
    defines, rules, cur, i = {}, [], None, 0
    while i < len(src):
        l = src[i]
        m = re.match(r"define\s+(\w+)", l)
        if m:
            body, i = [], i + 1
            while src[i].strip() != "endef":
                body.append((i + 1, src[i])); i += 1
            defines[m.group(1)] = body
            cur = None
        elif l.startswith("\t") and cur is not None:
            cur[1].append((i + 1, l[1:]))
        elif re.match(r"^[A-Za-z0-9_.%-]+(\s+[A-Za-z0-9_.%-]+)*\s*:(?![=:])", l):
            cur = (l.split(":")[0].split()[0], [])
            rules.append(cur)
        elif l.strip() and not l.startswith("#"):
            cur = None
            m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)\s*[:?]?=\s*(.*)$", l)
            if m and "$" not in m.group(2):
                MAKE_VARS.setdefault(m.group(1), m.group(2).strip())
        i += 1
    for target, body in rules:
        lines = []
        for n, l in body:
            m = re.fullmatch(r"\s*\$\((\w+)\)\s*", l)
            if m and m.group(1) in defines:
                lines.extend(defines[m.group(1)])
            else:
                lines.append((n, l))
        text = "\n".join(make_expand(l.lstrip("@-+")) for _, l in lines) + "\n"
        name = f"{path}:{target}"
        tree = shfmt_json(text, name)
        if tree is None:
            continue
        nums = [n for n, _ in lines]
        check_unit(name, tree, lambda k: nums[k - 1] if 0 < k <= len(nums) else k, functions(tree),
                   set())
        for k, (n, l) in enumerate(lines):
            hand_paths(name, make_expand(l), n)

def main(files):
    lib = lib_functions()
    for f in files:
        if f == "Makefile" or f.endswith("/Makefile"):
            check_makefile(f, lib)
        else:
            check_script(f, lib)

if sys.argv[1] == "--selftest":
    # Each case: a script, and what the check must say about it (a substring; "" = nothing).
    cases = [
        ("helm upgrade --install x chart\n", "runs helm without obtaining it"),
        ("need_tool helm\nhelm upgrade --install x chart\n", ""),
        ("helm lint\nneed_tool helm\n", "runs helm without obtaining it"),
        ("k=$(dirname \"$(tool_path kubectl)\")\n\"$k/kubectl\" get pods\n", ""),
        ("\"$K8S_BIN/kubectl\" get pods\n", "runs $K8S_BIN/kubectl without obtaining it"),
        ("p=$TOOLS_DIR/helm-v4/helm\n", "builds a tool's path by hand"),
        ("jq .items x.json\n", "runs jq, which"),
        ("need_tool kubectl\nkubectl singleton status x\n", "runs kubectl singleton without"),
        ("kubectl() { need_tool kubectl; command kubectl --kubeconfig k \"$@\"; }\nkubectl get x\n", ""),
        ("timeout 10 crictl ps\n", "runs crictl without obtaining it"),
        ("cat <<EOF\nhelm is only named here\nEOF\n", ""),
        ("cat <<EOF\n$(psql -c 1)\nEOF\n", "runs psql without obtaining it"),
        ("ensure_cmd openssl openssl\n", "ensure_cmd: Debian tools come through need_tool"),
        ("hack/build-tools.sh helm\n", "runs hack/build-tools.sh"),
        ("need_tool lscpu\n", "need_tool lscpu: not a tool of TOOLS"),
        ("hack/timed.sh --suites chart helm lint\n", "runs helm without obtaining it"),
    ]
    lib = lib_functions()
    bad = 0
    for text, want in cases:
        del errors[:]
        check_script("selftest.sh", lib, text)
        said = "\n".join(errors)
        if (want and want not in said) or (not want and said):
            print(f"self-test: for\n{text}expected {want or 'no finding'!r}, got {said or 'nothing'!r}",
                  file=sys.stderr)
            bad += 1
    mk = "t:\n\t\"$(HELM)\" lint\nu:\n\thelm=$$(hack/tool.sh helm)\n\t\"$$helm\" lint\n"
    del errors[:]
    with open(os.environ["SELFTEST_MAKEFILE"], "w") as f:
        f.write(mk)
    check_makefile(os.environ["SELFTEST_MAKEFILE"], lib)
    if len(errors) != 1 or "runs $(HELM)" not in errors[0]:
        print(f"self-test: Makefile: expected one finding about $(HELM), got {errors}", file=sys.stderr)
        bad += 1
    sys.exit(1 if bad else 0)

main(sys.argv[1:])
for e in errors:
    print(e, file=sys.stderr)
sys.exit(1 if errors else 0)
PY
}

tmp=$(mktemp); trap 'rm -f "$tmp"' EXIT
SELFTEST_MAKEFILE=$tmp check --selftest || die "the check itself is broken (self-test above)"
if [ $# -eq 0 ]; then set -- hack/*.sh .ci/run Makefile; fi
if ! check "$@"; then
  log "some programs are run without being obtained (above): a fresh machine would stop there"
  exit 1
fi
echo "every tool run by $* is obtained first ($(wc -w <<< "$TOOL_NAMES") tools known)"
