# Flotilla build. Tool versions are pinned in one place: the go.mod files
# under tools/ (tools/ protoc plugins, tools/buf, tools/lint, tools/kube for
# the test apiserver and etcd). Everything installs into bin/tools.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

ROOT      := $(CURDIR)
BIN       := $(ROOT)/bin
TOOLS     := $(BIN)/tools
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT    ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
BUILDINFO := github.com/flotilla-mesh/flotilla/internal/platform/buildinfo
LDFLAGS   := -s -w -X $(BUILDINFO).version=$(VERSION) -X $(BUILDINFO).commit=$(COMMIT)
export PATH := $(TOOLS):$(PATH)

# Workspace modules (go.work) and the binaries they produce.
MODULES  := api internal cli test services/galley services/discovery services/ca services/injector services/agent examples/demo
# Modules outside go.work (their dependency graphs must not touch the
# services): Istio's delta xDS client for discovery's tests.
STANDALONE := test/adsc
SERVICES := galley discovery ca injector agent
# `go test -race` everywhere; RACE= turns it off.
RACE     ?= -race

IMAGE_TAG ?= $(VERSION)
# The chart's appVersion: images are tagged with it too, so the chart of
# this checkout finds them without global.imageTag.
APP_VERSION := $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$$/\1/p' deploy/helm/flotilla/Chart.yaml)
IMAGES    := $(addprefix flotilla-,$(SERVICES)) flotilla-demo flotilla

.PHONY: images observability-image proxy-image build run test system-deps lint generate check-generate tidy bench bench-compare mutations bench-load tools kube-assets istio-agent clean check-modules help

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

build: ## build every binary into bin/ (static, version stamped)
	@mkdir -p $(BIN)
	@echo "building 8 binaries into $(BIN)/: the first build on a machine takes about 5 minutes on 2 cores (more while Go downloads the modules), later ones seconds"
	@for s in $(SERVICES); do \
	  echo "  flotilla-$$s"; \
	  CGO_ENABLED=0 go build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/flotilla-$$s ./services/$$s/cmd/$$s || exit 1; \
	done
	@echo "  flotilla (the CLI)"
	@CGO_ENABLED=0 go build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/flotilla ./cli/cmd/flotilla
	@echo "  flotilla-demo"
	@CGO_ENABLED=0 go build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/flotilla-demo ./examples/demo/cmd/flotilla-demo
	@echo "  devrun"
	@CGO_ENABLED=0 go build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/devrun ./internal/dev/cmd/devrun
	@echo "built"

# The image of binary $$b of bin/ (a shell variable where it is used).
IMAGE_BUILD = ctx=$(BIN)/images/$$b; rm -rf $$ctx; mkdir -p $$ctx/state/ca $$ctx/state/roots $$ctx/state/identity $$ctx/state/identity-key $$ctx/state/pod; cp $(BIN)/$$b $$ctx/; \
	  sed "s/@BINARY@/$$b/g" deploy/images/Dockerfile > $$ctx/Dockerfile; \
	  out=$$(docker build -q --build-arg VERSION=$(VERSION) --build-arg REVISION=$(COMMIT) -t $$b:$(IMAGE_TAG) -t $$b:$(APP_VERSION) -t $$b:latest $$ctx 2>&1) || { echo "$$out"; exit 1; }; \
	  echo "$$b:$(IMAGE_TAG)"

images: build ## container images FROM scratch (deploy/images/Dockerfile), tagged :$(IMAGE_TAG), :$(APP_VERSION) (the chart's appVersion) and :latest; needs only a Docker engine
	@for b in $(IMAGES); do \
	  $(IMAGE_BUILD) || exit 1; \
	done

observability-image: $(BIN)/flotilla-otelcol ## the trace backend of compose's observability profile: flotilla-otelcol, an OpenTelemetry Collector (built from its Go modules, tools/otelcol) that prints the traces it receives
	@b=flotilla-otelcol; $(IMAGE_BUILD)

$(BIN)/flotilla-otelcol: tools/otelcol/go.mod tools/otelcol/main.go
	@mkdir -p $(BIN)
	@echo "building flotilla-otelcol, the OpenTelemetry Collector of compose's observability profile (the first build takes about 3 minutes)"
	cd tools/otelcol && GOWORK=off CGO_ENABLED=0 go build -trimpath -o $(BIN)/flotilla-otelcol .

# The image flotilla-proxy takes its Envoy from: Istio's proxy image, whose
# Envoy has Istio's stats and peer-metadata filters (Istio's metrics); an
# upstream Envoy image works too, without them. The same tag as the
# chart's injector.proxyv2.image.
ENVOY_IMAGE ?= docker.io/istio/proxyv2:1.32.0

proxy-image: build ## the sidecar image flotilla-proxy (deploy/images/Dockerfile.proxy): Envoy from ENVOY_IMAGE (default Istio's proxyv2; or an upstream Envoy image, without Istio's metrics) plus flotilla-agent; not built in CI (images cannot be pulled there)
	@ctx=$(BIN)/images/flotilla-proxy; rm -rf $$ctx; mkdir -p $$ctx; cp $(BIN)/flotilla-agent $$ctx/; \
	  docker build -q --build-arg ENVOY_IMAGE=$(ENVOY_IMAGE) --build-arg VERSION=$(VERSION) --build-arg REVISION=$(COMMIT) \
	    -f deploy/images/Dockerfile.proxy -t flotilla-proxy:$(IMAGE_TAG) -t flotilla-proxy:$(APP_VERSION) -t flotilla-proxy:latest $$ctx && echo flotilla-proxy:$(IMAGE_TAG)

run: build ## run the control plane locally (no cluster); Ctrl-C stops it; RUN_FLAGS=--port-offset=1000 moves its ports (./bin/devrun --help)
	@$(BIN)/devrun --bin $(BIN) $(RUN_FLAGS)

# SKIPPED lists the tests that skipped in the last make test (testreport
# prints them at the end; .ci/run fails when Docker is there and one did).
SKIPPED := bin/skipped-tests.txt
test: system-deps tools kube-assets istio-agent check-generate lint check-modules ## everything CI checks: generated code, lint, module builds, all tests; lists the tests that skipped
	@mkdir -p bin && rm -f $(SKIPPED)
	set -o pipefail; go test $(RACE) -count=1 -timeout 20m -json work | go run ./internal/dev/cmd/testreport -skipped $(SKIPPED)
	@for m in $(STANDALONE); do (cd $$m && set -o pipefail && GOWORK=off go test $(RACE) -count=1 -timeout 10m -json ./... | (cd $(ROOT) && go run ./internal/dev/cmd/testreport -skipped $(SKIPPED))) || exit 1; done

SYSTEM_TOOLS := ip:iproute2 iptables-restore:iptables iptables-save:iptables ip6tables-restore:iptables ip6tables-save:iptables setpriv:util-linux nft:nftables unshare:util-linux mount:mount hostname:hostname docker-compose:docker-compose
system-deps: ## Debian packages the tests need (iptables, nft, unshare and mount for network namespaces; docker-compose, Compose v1); installed with apt-get when missing
	@missing=""; for t in $(SYSTEM_TOOLS); do command -v $${t%%:*} >/dev/null || missing="$$missing $${t##*:}"; done; \
	if [ -n "$$missing" ]; then echo "apt-get install$$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi

check-modules: ## each service module builds on its own (GOWORK=off), as image builds do; discovery and the agent link no Kubernetes library
	@for m in services/galley services/discovery services/ca services/injector services/agent cli examples/demo; do \
	  echo "GOWORK=off go build ./... in $$m"; \
	  (cd $$m && GOWORK=off CGO_ENABLED=0 go build -o /dev/null ./...) || exit 1; \
	done
	@for m in services/discovery services/agent; do \
	  k8s=$$(cd $$m && GOWORK=off go list -deps ./... | grep -E '^(k8s\.io|sigs\.k8s\.io)/' || true); \
	  if [ -n "$$k8s" ]; then echo "$$m links Kubernetes packages (discovery has no Kubernetes access; the agent, in every pod, keeps the probe types it needs in internal/appprobe):"; echo "$$k8s" | head -20; exit 1; fi; \
	  echo "$$m links no k8s.io package"; \
	done

mutations: kube-assets ## every testdata/mutations.txt: each change to the code there must make its tests fail (go test -overlay; the checkout is untouched)
	go run ./internal/dev/cmd/mutants

bench: kube-assets ## run every benchmark (results go in BENCHMARKS.md)
	go test -run '^$$' -bench . -benchmem -timeout 60m work

BENCH_COUNT ?= 6
bench-compare: $(TOOLS)/benchstat ## translation and push benchmarks of BASE=<commit> and of the working tree, alternated in one run, as ratios with their spread (BENCH_COUNT runs each, default 6; BENCH=<regexp> narrows them)
	@test -n "$(BASE)" || { echo "make bench-compare BASE=<commit>: BASE is required"; exit 2; }
	BENCHSTAT=$(TOOLS)/benchstat tools/bench-compare.sh "$(BASE)" $(BENCH_COUNT)

$(TOOLS)/benchstat: tools/benchstat/go.mod
	cd tools/benchstat && GOWORK=off GOBIN=$(TOOLS) go install golang.org/x/perf/cmd/benchstat

LOAD_CLIENTS ?= 100 1000 3000
LOAD_SIDECARS ?= 1000 2000 5000
LOAD_SPREAD ?= 3000
bench-load: build ## discovery under N proxyless gRPC clients (LOAD_CLIENTS="100 1000 3000") and N raw ADS sidecars, SotW and delta (LOAD_SIDECARS="1000 2000 5000"), each in their own process; LOAD_SPREAD sidecars moving from 1 to 3 replicas; galley fanning out to 20 replicas
	go build -o $(BIN)/xdsload ./test/cmd/xdsload
	@for n in $(LOAD_CLIENTS); do $(BIN)/xdsload run --bin $(BIN) --clients $$n --services 1000 --changes 5 2>/dev/null; done
	@for n in $(LOAD_SIDECARS); do for p in "" --delta; do $(BIN)/xdsload run --mode sidecar --bin $(BIN) --clients $$n --services 100 --changes 2 $$p 2>/dev/null; done; done
	@for n in $(LOAD_SPREAD); do $(BIN)/xdsload run --mode spread --bin $(BIN) --clients $$n --replicas 3 --connection-age 2m --changes 3 2>/dev/null; done
	$(BIN)/xdsload run --mode fanout --bin $(BIN) --replicas 20 --services 1000 --endpoints 10 --steps 10 --interval 1s 2>/dev/null

lint: tools ## golangci-lint (config: .golangci.yml) over every module, and buf lint
	@for m in $(MODULES); do \
	  echo "golangci-lint $$m"; \
	  (cd $$m && $(TOOLS)/golangci-lint run --config $(ROOT)/.golangci.yml ./...) || exit 1; \
	done
	@for m in $(STANDALONE); do \
	  echo "golangci-lint $$m"; \
	  (cd $$m && GOWORK=off $(TOOLS)/golangci-lint run --config $(ROOT)/.golangci.yml ./...) || exit 1; \
	done
	cd api && buf lint

GENERATED := api/gen deploy/helm/flotilla/crds deploy/helm/flotilla/dashboards internal/envoytypes/envoytypes.gen.go

generate: tools ## regenerate protobuf code (api/proto), the Istio CRDs and the Gateway API's (deploy/helm/flotilla/crds), the Grafana dashboards (deploy/helm/flotilla/dashboards) and the Envoy type registry (internal/envoytypes)
	cd api && buf generate
	go run ./internal/dev/cmd/crdgen --out deploy/helm/flotilla/crds/istio.yaml
	cd internal && GOWORK=off go mod download sigs.k8s.io/gateway-api && dir=$$(GOWORK=off go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api) && v=$$(GOWORK=off go list -m -f '{{.Version}}' sigs.k8s.io/gateway-api) && \
	{ echo "# The Kubernetes Gateway API's CRDs, standard channel, sigs.k8s.io/gateway-api $$v (config/crd/standard), as released."; \
	  for f in $$dir/config/crd/standard/gateway.networking.k8s.io_*.yaml; do echo "---"; cat $$f; done; } > ../deploy/helm/flotilla/crds/gateway-api.yaml
	go run ./internal/dev/cmd/envoytypesgen --out internal/envoytypes/envoytypes.gen.go
	go run ./internal/dev/cmd/dashboardgen --out deploy/helm/flotilla/dashboards

check-generate: generate ## fail if generated code differs from what is committed
	@if ! git diff --quiet --exit-code -- $(GENERATED) || [ -n "$$(git status --porcelain --untracked-files=all -- $(GENERATED))" ]; then \
	  git status --short -- $(GENERATED); git diff --stat -- $(GENERATED); \
	  echo "generated code is stale: run 'make generate' and commit the result"; exit 1; \
	fi

tidy: ## go work sync and go mod tidy in every module
	go work sync
	@for m in $(MODULES) $(STANDALONE); do (cd $$m && GOWORK=off go mod tidy) || exit 1; done
	@for m in tools tools/buf tools/lint tools/benchstat tools/kube tools/istio tools/helm tools/prometheus tools/otelcol tools/compose; do (cd $$m && GOWORK=off go mod tidy) || exit 1; done

# Compose v2, the docker CLI plugin, for test/compose; Compose v1
# (docker-compose) comes from Debian (system-deps). Defined before the
# rules that name it: a rule's prerequisites are expanded as it is read.
COMPOSE_V2 := $(TOOLS)/docker/cli-plugins/docker-compose

tools: $(TOOLS)/buf $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc $(TOOLS)/golangci-lint $(TOOLS)/helm $(TOOLS)/prometheus $(COMPOSE_V2) ## install the pinned tools into bin/tools

$(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc &: tools/go.mod
	cd tools && GOWORK=off GOBIN=$(TOOLS) go install google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc

$(TOOLS)/buf: tools/buf/go.mod
	cd tools/buf && GOWORK=off GOBIN=$(TOOLS) go install github.com/bufbuild/buf/cmd/buf

$(TOOLS)/helm: tools/helm/go.mod
	cd tools/helm && GOWORK=off GOBIN=$(TOOLS) go install helm.sh/helm/v3/cmd/helm

# Prometheus scrapes a running control plane in the dashboards' test; only
# static and file service discovery are built in (remove_all_sd).
$(TOOLS)/prometheus: tools/prometheus/go.mod
	@echo "building prometheus for the dashboards' test (the first build takes about 3 minutes)"
	cd tools/prometheus && GOWORK=off CGO_ENABLED=0 go build -tags remove_all_sd -o $(TOOLS)/prometheus github.com/prometheus/prometheus/cmd/prometheus

# Compose v2 ($(COMPOSE_V2), defined above `tools`): `docker compose` with
# DOCKER_CONFIG=$(TOOLS)/docker.
$(COMPOSE_V2): tools/compose/go.mod
	@echo "building Compose v2 for test/compose (the first build takes about 3 minutes)"
	cd tools/compose && v=$$(GOWORK=off go list -m -f '{{.Version}}' github.com/docker/compose/v2) && \
		GOWORK=off CGO_ENABLED=0 go build -ldflags "-X github.com/docker/compose/v2/internal.Version=$$v" -o $@ github.com/docker/compose/v2/cmd

$(TOOLS)/golangci-lint: tools/lint/go.mod
	cd tools/lint && GOWORK=off GOBIN=$(TOOLS) go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint

KUBE_ASSETS := $(TOOLS)/kube-apiserver $(TOOLS)/etcd $(TOOLS)/kube-controller-manager $(TOOLS)/kube-scheduler $(TOOLS)/kube-proxy $(TOOLS)/kwok $(TOOLS)/kwok.yaml

kube-assets: $(KUBE_ASSETS) ## build the tests' cluster: kube-apiserver, etcd, kube-controller-manager, kube-scheduler, kube-proxy and kwok (first build: minutes)

# kwok.yaml: kwok's own stages for its simulated nodes and pods (the "fast"
# ones: nodes Ready and pods Running and Ready at once, deletions finished),
# taken from the pinned module.
$(KUBE_ASSETS) &: tools/kube/go.mod tools/kube/cmd/etcd/main.go
	@echo "building kube-apiserver, etcd, kube-controller-manager, kube-scheduler, kube-proxy and kwok for tests (the first build takes several minutes)"
	cd tools/kube && GOWORK=off CGO_ENABLED=0 go build -o $(TOOLS)/ k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
		k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-proxy sigs.k8s.io/kwok/cmd/kwok ./cmd/etcd
	cd tools/kube && kwok=$$(GOWORK=off go list -m -f '{{.Dir}}' sigs.k8s.io/kwok) && \
		for f in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do \
			echo "---"; cat $$kwok/kustomize/stage/$$f.yaml; done > $(TOOLS)/kwok.yaml

ISTIO_AGENT := $(TOOLS)/pilot-agent $(TOOLS)/envoy_bootstrap_tmpl.json

istio-agent: $(ISTIO_AGENT) ## build Istio's own agent, pilot-agent, which test/istioagent runs against the control plane (first build: minutes)

# Istio's pilot-agent (the agent of Istio's proxyv2 image) from the module
# tools/istio pins, stamped as Istio's own Makefile stamps a build of that
# tree (the VERSION file's number and "-dev") with the commit the
# pseudo-version names, so the agent reports its version as an injected
# proxy does; and the Envoy bootstrap template the image holds beside it
# (/var/lib/istio/envoy/envoy_bootstrap_tmpl.json), which pilot-agent
# fills in for Envoy.
$(ISTIO_AGENT) &: tools/istio/go.mod
	@echo "building Istio's pilot-agent for test/istioagent (the first build takes about 4 minutes)"
	@mkdir -p $(TOOLS)
	cd tools/istio && GOWORK=off go mod download istio.io/istio && dir=$$(GOWORK=off go list -m -f '{{.Dir}}' istio.io/istio) && v=$$(GOWORK=off go list -m -f '{{.Version}}' istio.io/istio) && \
		GOWORK=off CGO_ENABLED=0 go build -trimpath \
		-ldflags "-X istio.io/istio/pkg/version.buildVersion=$$(cat $$dir/VERSION)-dev -X istio.io/istio/pkg/version.buildGitRevision=$${v##*-}" \
		-o $(TOOLS)/pilot-agent istio.io/istio/pilot/cmd/pilot-agent && \
		install -m 0644 $$dir/tools/packaging/common/envoy_bootstrap.json $(TOOLS)/envoy_bootstrap_tmpl.json

clean: ## remove built binaries and tools
	rm -rf $(BIN)
