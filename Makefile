# Developer entry points. Each target is a thin wrapper over hack/*.sh or cargo, so a developer and CI
# (.ci/run = `make test`) run the same steps. Variables can be overridden: `make e2e E2E_THREADS=1`.
# A recipe gets a tool as the scripts do (need_tool in hack/lib.sh): `helm=$$(hack/tool.sh helm)`
# prints the path of a verified helm, building it first on a fresh machine; hack/tool-uses-test.sh
# (make lint) fails on a recipe or script that runs a tool it did not obtain.
# `make test` times its stages (hack/timed.sh) and prints the table at the end.
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
# One shell per recipe, so traps and variables span the whole recipe (e2e's teardown needs that).
.ONESHELL:
.DEFAULT_GOAL := help

CARGO ?= cargo
E2E_THREADS ?= 4
# Two lanes take from e2e's queue from the start, the real nodes' and the two-cluster lanes too
# once their own work is done: four processes at a time. With three from the start (five at once)
# the timing checks of `noisy` and the real nodes' failover bound failed under the load.
E2E_LANES ?= 2
# And one more from the queue's other end, the shortest binaries first (hack/e2e.sh).
E2E_TAIL_LANES ?= 1
CHAOS_LANES ?= 3
CRD_FILE ?= crds/singletonjob.yaml
CALENDAR_CRD_FILE ?= crds/singletoncalendar.yaml
CHART_DIR ?= charts/singleton-controller
# The chart's copy of the CRD (a chart cannot read files outside itself): `make crds` writes it,
# `make chart` fails when it differs from $(CRD_FILE).
CHART_CRD := $(CHART_DIR)/files/singletonjob.yaml
CHART_CALENDAR_CRD := $(CHART_DIR)/files/singletoncalendar.yaml
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
# Runs a step as a timed stage of `make test` (a plain run outside it).
TIMED := hack/timed.sh

.PHONY: help tools up down status env crds lint chart unit clients examples e2e upgrade chaos test demo demo-stop demo-dr demo-dr-stop bench image

help:
	@echo 'make tools    build the pinned control-plane binaries, the real node (kubelet, containerd), promtool, cargo-deny, the SBOM tools (cargo-cyclonedx, cyclonedx-gomod, cyclonedx-py) and shfmt (cached in ~/.cache/singleton-controller, checked by hash); every target builds what it uses on its own, hack/tool.sh NAME one tool'
	echo 'make up       start the local cluster, its real node (SINGLETON_REAL_NODE=0: kwok only), PostgreSQL and MariaDB (no-op when already up)'
	echo 'make down     stop them, delete their state and restore what the real node changed on the host'
	echo 'make image    build the controller image and the billing workload images (Rust, Go, Python) with buildah (no Docker) and import them into the real node'
	echo 'make status   show what runs'
	echo 'make env      print exports for: eval "$$(make -s env)" (KUBECONFIG, DATABASE_URL, MARIADB_URL, PATH with kubectl, helm, kubectl-singleton)'
	echo 'make crds     regenerate $(CRD_FILE) from the Rust types'
	echo 'make lint     rustfmt, cargo deny (the RustSec advisories fail when their database cannot be read; SINGLETON_ADVISORIES=skip skips them), clippy, rustdoc links, the image context, the CRD drift check, the alert rules (promtool) and that every tool a script runs is obtained first'
	echo 'make chart    helm lint and rendering tests of $(CHART_DIR) (no cluster needed)'
	echo 'make unit     unit tests'
	echo 'make clients  the client libraries (clients/go, python, java, typescript) against PostgreSQL and MariaDB'
	echo 'make examples the billing workloads in Go and Python (examples/billing/go, python) against PostgreSQL'
	echo 'make e2e      end-to-end tests (starts and stops the cluster if it was not running)'
	echo 'make upgrade  the upgrade suite alone (e2e/tests/upgrade.rs, part of make e2e): the previous release built from its tag, upgraded, rolled back and upgraded again mid-burst, on a control plane of its own (~2 min; the first build of the previous release ~4 min more)'
	echo 'make chaos    the fault-injection suite, about a minute per fault; prints the table'
	echo 'make test     lint + chart + unit + e2e (what CI runs), then a table of how long each stage took'
	echo 'make demo     the chart on the real node (images built locally) running the billing example every 10 s, namespace singleton-demo (examples/hello.yaml on kwok with SINGLETON_REAL_NODE=0)'
	echo 'make demo-stop  stop the demo controller (helm uninstall; make down stops everything)'
	echo 'make demo-dr  disaster recovery: two clusters (west primary, east standby) sharing one PostgreSQL, west'"'"'s API server stopped mid-demo, east carrying on; ends with a verdict (~2 min; own ports, runs beside make up; stops what it started, DEMO_DR_KEEP=1 keeps it)'
	echo 'make demo-dr-stop  stop what make demo-dr DEMO_DR_KEEP=1 left running'
	echo 'make bench    SingletonJob against CronJob on its own local cluster (~35 min; BENCH=quick ~11 min): bench/results/'

tools:
	hack/build-tools.sh

up:
	hack/cluster.sh up

down:
	hack/cluster.sh down

status:
	hack/cluster.sh status

env:
	@hack/cluster.sh env

image:
	hack/image.sh

# Through a temporary file, so a failing crdgen never truncates the committed CRD.
crds:
	tmp=$$(mktemp); trap 'rm -f "$$tmp"' EXIT
	$(CARGO) run -q -p singleton-controller --bin crdgen > "$$tmp"
	cat "$$tmp" > $(CRD_FILE)
	cat "$$tmp" > $(CHART_CRD)
	$(CARGO) run -q -p singleton-controller --bin crdgen calendar > "$$tmp"
	cat "$$tmp" > $(CALENDAR_CRD_FILE)
	cat "$$tmp" > $(CHART_CALENDAR_CRD)

lint:
	$(TIMED) rustfmt $(CARGO) fmt --all -- --check
	# Every tool the scripts, this Makefile and .ci/run run is obtained first (builds shfmt).
	$(TIMED) tool-uses hack/tool-uses-test.sh
	# Dependencies: licenses, duplicate versions, sources (offline), then the RustSec advisories:
	# an unreadable advisory database fails here unless SINGLETON_ADVISORIES=skip (hack/deny.sh).
	$(TIMED) cargo-deny hack/deny.sh
	$(TIMED) cargo-deny-modes hack/deny-test.sh
	# The cached Go-built tools match the hashes committed in hack/tools/SHA256SUMS.
	$(TIMED) tool-hashes hack/tools-test.sh
	# The chart's alert rules: promtool check and unit tests (builds promtool on first use).
	$(TIMED) alert-rules hack/rules-test.sh
	$(TIMED) clippy $(CARGO) clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS='-D warnings' $(TIMED) rustdoc $(CARGO) doc --workspace --no-deps -q
	CARGO_TARGET_DIR=$(TARGET_DIR) $(TIMED) image-context hack/image-context.sh
	tmp=$$(mktemp); trap 'rm -f "$$tmp"' EXIT
	for pair in job:$(CRD_FILE) calendar:$(CALENDAR_CRD_FILE); do
	  $(CARGO) run -q -p singleton-controller --bin crdgen "$${pair%%:*}" > "$$tmp"
	  if ! diff -u --label "$${pair#*:}" --label 'crdgen output' "$${pair#*:}" "$$tmp"; then
	    echo "$${pair#*:} does not match the Rust types: run 'make crds' and commit the result" >&2
	    exit 1
	  fi
	done

chart:
	# A fresh machine has no helm yet: hack/tool.sh builds it (a hash check when cached).
	helm=$$(hack/tool.sh helm)
	for pair in $(CRD_FILE):$(CHART_CRD) $(CALENDAR_CRD_FILE):$(CHART_CALENDAR_CRD); do
	  if ! diff -u --label "$${pair%%:*}" --label "$${pair#*:}" "$${pair%%:*}" "$${pair#*:}"; then
	    echo "$${pair#*:} differs from $${pair%%:*}: run 'make crds' (it writes both)" >&2
	    exit 1
	  fi
	done
	"$$helm" lint --strict $(CHART_DIR)
	"$$helm" lint --strict $(CHART_DIR) --set 'watchNamespaces={team-a}' --set metrics.serviceMonitor.enabled=true \
	  --set networkPolicy.enabled=true --set 'networkPolicy.egress.apiServer.cidrs={10.0.0.1/32}' --set metrics.tlsSecret=metrics-tls
	HELM=$$helm $(CARGO) test -p e2e --test chart_render

# The backstop's tests run against a real PostgreSQL and MariaDB: start them (a no-op when they
# run). Built
# once, then the integration test binaries (the model check, ~2 min of CPU, among them) beside
# the crates' own unit tests and doc tests: a row per test binary in `make test`'s table, each
# side's output printed whole when it ends. The e2e crate's own unit tests (the chaos checker's
# judgements, no cluster) run here too; its test binaries are `make e2e`'s.
unit:
	hack/postgres.sh up >/dev/null
	hack/mariadb.sh up >/dev/null
	export DATABASE_URL=$$(hack/postgres.sh url)
	export MARIADB_URL=$$(hack/mariadb.sh url)
	$(TIMED) "unit build" $(CARGO) test --workspace --exclude e2e --no-run -q
	$(TIMED) "unit build (e2e lib)" $(CARGO) test -p e2e --lib --no-run -q
	log=$(TARGET_DIR)/unit-integration.log rc=0
	$(TIMED) --suites . $(CARGO) test --workspace --exclude e2e --test '*' > "$$log" 2>&1 & side=$$!
	$(TIMED) --suites . $(CARGO) test --workspace --exclude e2e --lib --bins || rc=$$?
	$(TIMED) --suites . $(CARGO) test -p e2e --lib || rc=$$?
	$(TIMED) --suites . $(CARGO) test --workspace --exclude e2e --doc || rc=$$?
	wait $$side || rc=$$?
	cat "$$log"
	exit $$rc

# The client libraries (clients/<language>/), each tested by its own script against the real
# PostgreSQL and MariaDB, with its ecosystem's tools (Go, Python, Maven, npm) and caches under
# the tools cache: a row each in `make test`'s table.
CLIENTS := go python java typescript
clients:
	hack/postgres.sh up >/dev/null
	hack/mariadb.sh up >/dev/null
	export DATABASE_URL=$$(hack/postgres.sh url)
	export MARIADB_URL=$$(hack/mariadb.sh url)
	rc=0
	for lang in $(CLIENTS); do $(TIMED) "clients $$lang" clients/$$lang/test.sh || rc=1; done
	exit $$rc

# The billing example's Go and Python workloads (examples/billing/<language>/, beside the Rust
# one in the workspace), each tested by its own script against the real PostgreSQL.
EXAMPLES := go python
examples:
	hack/postgres.sh up >/dev/null
	export DATABASE_URL=$$(hack/postgres.sh url)
	rc=0
	for lang in $(EXAMPLES); do $(TIMED) "billing $$lang" examples/billing/$$lang/test.sh || rc=1; done
	exit $$rc

# The start of the e2e and chaos recipes (one shell each, .ONESHELL): the cluster up, the
# controller built, the CRD installed, the environment the tests read exported. Tear down
# afterwards only a cluster this invocation started, also on failure or Ctrl-C.
define CLUSTER_FOR_TESTS
started=
if ! hack/cluster.sh status >/dev/null 2>&1; then started=1; fi
trap 'if [ -n "$$started" ]; then hack/cluster.sh down; fi' EXIT
trap 'exit 130' INT TERM
if [ -n "$$started" ]; then $(TIMED) "cluster up" hack/cluster.sh up; fi
$(TIMED) "controller build" $(CARGO) build -p singleton-controller --bins --features failpoints
# The images the real node's tests run (tests/real_node.rs), when the real node runs.
if hack/node.sh status >/dev/null 2>&1; then $(TIMED) images hack/image.sh; fi
env=$$(hack/cluster.sh env)
eval "$$env"
export SINGLETON_CONTROLLER_BIN=$(TARGET_DIR)/debug/singleton-controller
# The tests run these (e2e/src/commands.rs), the chart's tests helm.
KUBECTL=$$(hack/tool.sh kubectl)
HELM=$$(hack/tool.sh helm)
export KUBECTL HELM
# The upgrade suite's and the mixed-versions chaos row's older builds: built from this
# repository's history when missing, then cached.
older=$$(hack/previous-release.sh env)
eval "$$older"
"$$KUBECTL" apply --server-side -f crds/
"$$KUBECTL" wait --for=condition=Established --timeout=60s -f crds/
# Each test deletes its namespace; this catches those a crashed test left behind. The second
# control plane the multi-cluster tests start (e2e/src/multicluster.rs) and the four of
# hack/own-cluster.sh (the cluster-wide chaos rows', the hostile-tenant suite's, the version-skew
# tests', the upgrade suite's) are stopped in any case.
trap 'SINGLETON_CLUSTER_NAME=second hack/cluster.sh down >/dev/null 2>&1 || true; hack/own-cluster.sh down >/dev/null 2>&1 || true; if [ -n "$$started" ]; then hack/cluster.sh down; else "$$KUBECTL" delete namespace -l singleton.dev/e2e=true --wait=false >/dev/null 2>&1 || true; fi' EXIT
endef

# The upgrade suite alone, on its own control plane (hack/own-cluster.sh, instance own4); `make
# e2e` runs it too.
upgrade:
	$(TIMED) "controller build" $(CARGO) build -p singleton-controller --bins --features failpoints
	export SINGLETON_CONTROLLER_BIN=$(TARGET_DIR)/debug/singleton-controller
	KUBECTL=$$(hack/tool.sh kubectl)
	HELM=$$(hack/tool.sh helm)
	export KUBECTL HELM
	older=$$(hack/previous-release.sh env)
	eval "$$older"
	SINGLETON_OWN_INSTANCE=own4 $(TIMED) --suites upgrade hack/own-cluster.sh run \
	  $(CARGO) test -p e2e --test upgrade -- --nocapture

# The e2e test binaries and the chaos suite's short form, all side by side (hack/e2e.sh): the
# real nodes' rows, the two-cluster tests then their rows, and the rest from a queue that
# E2E_LANES lanes take from (and those two once done);
# what stops the API server, etcd or PostgreSQL does so on a cluster of its own
# (hack/own-cluster.sh). In `make test`'s table: a row per test binary, per chaos process and per
# chaos scenario.
e2e:
	$(CLUSTER_FOR_TESTS)
	E2E_LANES=$(E2E_LANES) E2E_TAIL_LANES=$(E2E_TAIL_LANES) E2E_THREADS=$(E2E_THREADS) CHAOS_LANES=$(CHAOS_LANES) \
	  CHAOS_REPORT=$(TARGET_DIR)/chaos/short.md $(TIMED) . hack/e2e.sh

# The fault-injection suite, full length (docs/reliability.md). Like e2e, it starts the cluster
# when it is not running and then stops it again; the table is printed and kept in $(CHAOS_REPORT).
CHAOS_REPORT ?= $(TARGET_DIR)/chaos/report.md
chaos:
	$(CLUSTER_FOR_TESTS)
	rm -f "$(CHAOS_REPORT)"
	rc=0
	CHAOS=full CHAOS_REPORT="$(CHAOS_REPORT)" $(TIMED) --chaos "chaos (full)" \
	  $(CARGO) test -p e2e --test chaos -- --nocapture || rc=$$?
	if [ -s "$(CHAOS_REPORT)" ]; then echo; cat "$(CHAOS_REPORT)"; echo "(kept in $(CHAOS_REPORT))"; fi
	exit $$rc

# Sub-makes rather than prerequisites, so the order holds under `make -j` too. Each is a timed
# stage (hack/timed.sh); the table of them is printed at the end, also when one fails. A caller
# that collects its own table (.ci/run: make demo's row too) has set SINGLETON_STAGES and prints it.
test:
	if [ -z "$${SINGLETON_STAGES:-}" ]; then
	  export SINGLETON_STAGES=$(TARGET_DIR)/stages.tsv
	  $(TIMED) reset
	  trap '$(TIMED) report' EXIT
	fi
	$(TIMED) lint $(MAKE) --no-print-directory lint
	$(TIMED) chart $(MAKE) --no-print-directory chart
	# The client libraries and the examples' Go and Python workloads beside the unit tests (mostly downloads and waiting on the databases,
	# which both use and which are started once here, so the two never race to create them);
	# the libraries' output is printed whole when they end.
	hack/postgres.sh up >/dev/null
	hack/mariadb.sh up >/dev/null
	log=$(TARGET_DIR)/clients.log rc=0
	mkdir -p $(TARGET_DIR)
	{ $(TIMED) clients $(MAKE) --no-print-directory clients && $(TIMED) examples $(MAKE) --no-print-directory examples; } > "$$log" 2>&1 & clients=$$!
	$(TIMED) unit $(MAKE) --no-print-directory unit || rc=$$?
	wait $$clients || rc=$$?
	cat "$$log"
	[ $$rc = 0 ]
	$(TIMED) e2e $(MAKE) --no-print-directory e2e

demo:
	hack/demo.sh

demo-stop:
	hack/demo.sh stop

demo-dr:
	hack/demo-dr.sh

demo-dr-stop:
	hack/demo-dr.sh stop

# Refuses a running cluster not started with its flags; starts and stops its own otherwise.
bench:
	hack/bench.sh
