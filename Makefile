# seedrl: `make demo` trains CartPole-v1 to solved; `make test` runs lint + the test suite.
# Everything runs from a project-local virtual environment that the first target creates.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

ENV ?= CartPole-v1
PORT ?= 8686
BIND ?= 127.0.0.1
LEARNER ?= 127.0.0.1:$(PORT)
LOGDIR ?= runs/latest
N ?= 4
GPUS ?= 1
# Empty: actors step the envs per actor the learner advises (its preset), else 1.
ENVS_PER_ACTOR ?=
ARGS ?=
PYTEST_ARGS ?=
# Extra env families / tools to install besides learner+dev: `make install EXTRAS=atari,minatar`
# (dev already brings every env family's package, MuJoCo's included, for the tests)
EXTRAS ?=

.PHONY: install proto proto-check learner actors actors-cpp demo evaluate serve test test-long test-slow test-cluster lint \
        bench bench-quick bench-pixels bench-learning bench-learning-table plot tensorboard \
        wheelhouse base-image images cluster cluster-down cluster-logs k8s-secret clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install --quiet -e '.[learner,dev$(if $(EXTRAS),$(comma)$(EXTRAS))]'
	touch $(STAMP)

comma := ,

## Regenerate the committed gRPC/protobuf code from protos/.
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -Iprotos --python_out=. --grpc_python_out=. --pyi_out=. \
		protos/seedrl/proto/seedrl.proto

## Learner on this host: `make learner ENV=CartPole-v1 PORT=8686 LOGDIR=runs/x ARGS=...`
## GPUS=G > 1 starts G data-parallel ranks with torchrun (rank r serves PORT + r).
learner: $(STAMP)
ifeq ($(GPUS),1)
	$(PY) -m learner --env $(ENV) --bind $(BIND) --port $(PORT) --logdir $(LOGDIR) $(ARGS)
else
	$(VENV)/bin/torchrun --standalone --nproc-per-node=$(GPUS) -m learner --env $(ENV) \
		--bind $(BIND) --port $(PORT) --logdir $(LOGDIR) $(ARGS)
endif

# A module:callable ENV is one this host chose, so its actors and evaluate may build it
# when a learner or a checkpoint names it (they refuse any other module:callable env).
ALLOW_ENV = $(if $(findstring :,$(ENV)),--allow-env-module $(ENV))

## Actors: `make actors N=64 LEARNER=host:port ENVS_PER_ACTOR=1 ARGS=...` (env comes from the
## learner, and envs per actor too unless ENVS_PER_ACTOR is set; a module:callable env
## only when it is ENV or allowed with --allow-env-module)
actors: $(STAMP)
	$(PY) -m actors --learner $(LEARNER) --num-actors $(N) \
		$(if $(ENVS_PER_ACTOR),--envs-per-actor $(ENVS_PER_ACTOR)) $(ALLOW_ENV) $(ARGS)

## The reference C++ actor (actors/cpp/, CMake; needs gRPC C++ and protobuf, e.g. Debian's
## libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc cmake): then
## `actors/cpp/build/seedrl-actor --learner HOST:PORT --envs-per-actor K`.
CPP_BUILD ?= actors/cpp/build
actors-cpp:
	cmake -S actors/cpp -B $(CPP_BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(CPP_BUILD) -j $$(nproc 2>/dev/null || echo 2)

## Run a checkpoint's policy: `make evaluate CHECKPOINT=runs/x/checkpoint.pt ARGS="--video out.gif"`
CHECKPOINT ?= $(LOGDIR)/checkpoint.pt
evaluate: $(STAMP)
	$(PY) -m learner evaluate --checkpoint $(CHECKPOINT) $(ALLOW_ENV) $(ARGS)

## Serve a checkpoint's policy to actors, untrained: `make serve CHECKPOINT=runs/x/checkpoint.pt
## ARGS="--greedy"` (then `make actors`); metrics go to SERVE_LOGDIR, never beside the checkpoint.
SERVE_LOGDIR ?= runs/serve
serve: $(STAMP)
	$(PY) -m learner serve --checkpoint $(CHECKPOINT) --bind $(BIND) --port $(PORT) \
		--logdir $(SERVE_LOGDIR) $(ALLOW_ENV) $(ARGS)

## A learner and local actors train CartPole-v1 until solved; leaves metrics, TB logs, PNG.
demo: $(STAMP)
	$(PY) -m learner demo $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

## Two test processes: most system tests wait on sockets and child processes, so two
## share two cores well (PYTEST_WORKERS=0 runs them in this process, e.g. for -s or --pdb).
PYTEST_WORKERS ?= 2
test: lint
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal --durations=15 $(PYTEST_ARGS)

## The end-to-end runs that keep make test short: real process trees under faults, the
## benchmark harnesses end to end, short learning bars (CI runs them after make test).
test-long: $(STAMP)
	$(PY) -m pytest -q -m long -n $(PYTEST_WORKERS) --dist worksteal --durations=15 $(PYTEST_ARGS)

## The long learning runs CI skips (e.g. CartPole all the way to 475).
test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

## Build the images offline and run a compose cluster (needs Docker, or root to start one).
test-cluster: $(STAMP)
	$(PY) -m pytest -q -s -m cluster -rs $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m learner bench $(ARGS)

bench-quick: $(STAMP)
	$(PY) -m learner bench --quick $(ARGS)

## Learning benchmark: `make bench-learning SUITE=classic|classic-r2d2|classic-long|minatar|minigrid|atari|mujoco|multiagent|selfplay|structured|pbt
## [AGENT=vtrace|r2d2|sac] [FRAMES=N] [SEEDS=2] [FIRST_SEED=0] [ENVS=Breakout,Pong]`: every env
## x seed trained to FRAMES (0: the suite's budget); the finished runs are archived
## (thinned, no checkpoints) in BENCH_RESULTS to be committed, and docs/learning.md's table
## is rebuilt from there. AGENT=r2d2 (or sac) runs the suite's twin (SUITE-AGENT: the same envs
## on the AGENT presets; pendulum-sac is SAC's own). Interrupted, it resumes.
SUITE ?= classic
AGENT ?= vtrace
BENCH_SUITE = $(if $(filter vtrace,$(AGENT)),$(SUITE),$(SUITE:%-$(AGENT)=%)-$(AGENT))
FRAMES ?= 0
SEEDS ?= 2
FIRST_SEED ?= 0
ENVS ?=
BENCH_OUT ?= runs/bench-learning/$(BENCH_SUITE)
BENCH_RESULTS ?= benchmarks/results/learning/$(BENCH_SUITE)
bench-learning: $(STAMP)
	$(PY) -m benchmarks.learning run --suite $(BENCH_SUITE) --frames $(FRAMES) --seeds $(SEEDS) \
		--first-seed $(FIRST_SEED) --envs '$(ENVS)' --out $(BENCH_OUT) $(ARGS)
	$(PY) -m benchmarks.learning archive --out $(BENCH_OUT) --results $(BENCH_RESULTS)
	$(MAKE) --no-print-directory bench-learning-table SUITE=$(SUITE) AGENT=$(AGENT) \
		BENCH_RESULTS=$(BENCH_RESULTS)

## The suite's summary, curves and table in docs/learning.md, from its archived runs.
bench-learning-table: $(STAMP)
	$(PY) -m benchmarks.learning table --out $(BENCH_RESULTS) --doc docs/learning.md

## Pixel rows: MinAtar and ALE Atari with their presets' model and batch, a sweep sized for
## 2 cores (needs `make install EXTRAS=atari,minatar`); writes bench-minatar/atari.json.
bench-pixels: $(STAMP)
	$(PY) -m learner bench --env MinAtar/Breakout-v1 --preset minatar \
		--sweep 1x16,2x16,4x8 --focus-repeats 0 --out bench-minatar.json $(ARGS)
	$(PY) -m learner bench --env ALE/Pong-v5 --preset atari \
		--sweep 1x16,2x16 --focus-repeats 0 --out bench-atari.json $(ARGS)

plot: $(STAMP)
	$(PY) -m learner plot $(LOGDIR)

tensorboard: $(STAMP)
	$(VENV)/bin/tensorboard --logdir $(LOGDIR) --bind_all

## Wheels for offline image builds (for the Python that runs this: 3.11 = bookworm's).
WHEELHOUSE ?= deploy/wheelhouse
wheelhouse: $(STAMP)
	$(PY) -m pip wheel --quiet --wheel-dir $(WHEELHOUSE) '.[learner]' 'setuptools>=77'
	rm -f $(WHEELHOUSE)/seedrl-*.whl

## A python3 base image from Debian packages, for hosts without an image registry (root).
BASE_TAG ?= seedrl-base:bookworm
base-image:
	deploy/base-image.sh $(BASE_TAG)

## Both images with the docker CLI (what `make cluster` runs): `make images BUILD_FLAGS=--network\ none`
## builds offline from a wheelhouse. SEEDRL_TAG, SEEDRL_BASE_IMAGE, SEEDRL_WHEELHOUSE and
## TORCH_INDEX_URL (environment or make variables) are the ones the compose file reads.
SEEDRL_TAG ?= latest
SEEDRL_BASE_IMAGE ?= python:3.12-slim
SEEDRL_WHEELHOUSE ?= deploy/wheelhouse
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cpu
BUILD_FLAGS ?=
IMAGE_ARGS = $(BUILD_FLAGS) --build-arg BASE_IMAGE=$(SEEDRL_BASE_IMAGE) \
	--build-arg WHEELHOUSE=$(SEEDRL_WHEELHOUSE)
images:
	docker build $(IMAGE_ARGS) --build-arg TORCH_INDEX_URL=$(TORCH_INDEX_URL) \
		-f deploy/Dockerfile.learner -t seedrl-learner:$(SEEDRL_TAG) .
	docker build $(IMAGE_ARGS) -f deploy/Dockerfile.actor -t seedrl-actor:$(SEEDRL_TAG) .

## Learner + N actor containers: `make cluster N=64` (the compose plugin or docker-compose).
## Offline: `make wheelhouse base-image` first, then SEEDRL_BASE_IMAGE=seedrl-base:bookworm.
COMPOSE ?= $(shell if docker compose version >/dev/null 2>&1; then echo docker compose; \
	elif command -v docker-compose >/dev/null; then echo docker-compose; fi)
CLUSTER ?= seedrl
## STANDBY=1 adds a standby learner the actors fail over to (deploy/docker-compose.standby.yml).
STANDBY ?=
COMPOSE_ARGS = -p $(CLUSTER) -f deploy/docker-compose.yml \
	$(if $(STANDBY),-f deploy/docker-compose.standby.yml)

cluster: deploy/seedrl.env deploy/tls/ca.pem images
	@test -n "$(COMPOSE)" || { echo "make cluster needs 'docker compose' or docker-compose" >&2; exit 2; }
	SEEDRL_TAG=$(SEEDRL_TAG) $(COMPOSE) $(COMPOSE_ARGS) up --detach --no-build --scale actor=$(N)
	@echo "follow: make cluster-logs; stop and remove everything: make cluster-down"

cluster-logs:
	$(COMPOSE) $(COMPOSE_ARGS) logs --follow --tail 20 learner

## Removes the containers, the network and the runs volume (copy runs out first if needed).
cluster-down:
	@test -n "$(COMPOSE)" || { echo "make cluster-down needs 'docker compose' or docker-compose" >&2; exit 2; }
	$(COMPOSE) $(COMPOSE_ARGS) down --volumes --remove-orphans

## The token and TLS files `kubectl apply -k deploy/k8s` turns into Secrets and a ConfigMap.
k8s-secret: deploy/k8s/seedrl.env deploy/k8s/tls/ca.pem

# A random shared token, written once, readable only by you, never committed.
deploy/seedrl.env deploy/k8s/seedrl.env:
	umask 077 && printf 'SEEDRL_AUTH_TOKEN=%s\n' \
		"$$($(PYTHON) -c 'import secrets; print(secrets.token_urlsafe(32))')" > $@

# A private CA and the learner's certificate beside the token, written once, never
# committed: the deployments serve TLS. TLS_NAMES: more names actors dial the learner by
# (e.g. this host's name when SEEDRL_PUBLISH lets actors on other hosts in).
TLS_NAMES ?=
CERTS_PY = $(if $(wildcard $(PY)),$(PY),$(PYTHON))
deploy/tls/ca.pem deploy/k8s/tls/ca.pem:
	$(CERTS_PY) deploy/certs.py --out $(@D) $(foreach name,$(TLS_NAMES),--name $(name))

## Render a bench.json as the results table of docs/performance.md: `make bench-table BENCH_JSON=bench.json`
BENCH_JSON ?= bench.json
.PHONY: bench-table bench-pixels-table
bench-table: $(STAMP)
	$(PY) benchmarks/results_table.py $(BENCH_JSON) --update docs/performance.md

## The Atari pixel rows (bench-atari.json from `make bench-pixels`) as their own block.
bench-pixels-table: $(STAMP)
	$(PY) benchmarks/results_table.py bench-atari.json --update docs/performance.md --block bench-atari

## The GPU check's JSONs (benchmarks/results/*-$(GPU_TAG)-*) as the GPU block of docs/performance.md
GPU_TAG ?= h200
GPU_RESULTS ?= benchmarks/results
## seedrl beside stable-baselines3 PPO, Sample Factory APPO and PufferLib PPO on this machine,
## in one run (CartPole to 475, Atari Pong frames/s; each peer's venv is built on first use under
## ~/.cache/seedrl/peers): writes PEERS_JSON and docs/performance.md's peers table.
## ARGS="--suite structured --merge": seedrl's and SB3 PPO's defaults on the structured suite too.
PEERS_JSON ?= benchmarks/results/peers.json
.PHONY: bench-peers bench-peers-table
bench-peers: $(STAMP)
	$(PY) -m benchmarks.peers run --out $(PEERS_JSON) $(ARGS)
	$(MAKE) --no-print-directory bench-peers-table PEERS_JSON=$(PEERS_JSON)

bench-peers-table: $(STAMP)
	$(PY) -m benchmarks.peers table $(PEERS_JSON) --update docs/performance.md

## R2D2's sum tree beside cpprb's and torchrl's prioritized replays, at the presets' replay
## sizes (python -m benchmarks.replay_libs; builds the libraries' venv on first use).
REPLAY_LIBS_JSON ?= benchmarks/results/replay-libs.json
.PHONY: bench-replay-libs bench-replay-libs-table
bench-replay-libs: $(STAMP)
	$(PY) -m benchmarks.replay_libs run --out $(REPLAY_LIBS_JSON) $(ARGS)
	$(MAKE) --no-print-directory bench-replay-libs-table REPLAY_LIBS_JSON=$(REPLAY_LIBS_JSON)

bench-replay-libs-table: $(STAMP)
	$(PY) -m benchmarks.replay_libs table $(REPLAY_LIBS_JSON) --update docs/performance.md

## The C++ reference actor beside the Python actor at K = 1 and 32 envs, in one run: writes
## CPP_ACTOR_JSON and docs/performance.md's C++ actor table.
CPP_ACTOR_JSON ?= benchmarks/results/cpp-actor.json
.PHONY: bench-cpp-actor bench-cpp-actor-table
bench-cpp-actor: $(STAMP) actors-cpp
	$(PY) -m benchmarks.cpp_actor run --out $(CPP_ACTOR_JSON) --binary $(CPP_BUILD)/seedrl-actor $(ARGS)
	$(MAKE) --no-print-directory bench-cpp-actor-table CPP_ACTOR_JSON=$(CPP_ACTOR_JSON)

bench-cpp-actor-table: $(STAMP)
	$(PY) -m benchmarks.cpp_actor table $(CPP_ACTOR_JSON) --update docs/performance.md

.PHONY: gpu-table
gpu-table: $(STAMP)
	$(PY) -m benchmarks.gpu_table $(GPU_RESULTS)/gpu-check-$(GPU_TAG)-summary.json \
		--timings $(GPU_RESULTS)/gpu-check-$(GPU_TAG)-timings.jsonl \
		--bench $(GPU_RESULTS)/bench-$(GPU_TAG)-atari.json $(GPU_RESULTS)/bench-$(GPU_TAG)-cartpole.json \
		--update docs/performance.md

## The learner's ceiling under synthetic actors (python -m benchmarks.loadgen): CartPole-v1 at
## 64 streams x 1 env and Atari Pong single frames at 16 x 1, each mode repeated; writes
## LOADGEN_RESULTS/loadgen-{cartpole,atari}.json and docs/performance.md's loadgen block.
## SERVING_PROCESSES=0,2 measures the learner in-process and with 2 serving-tier frontends,
## interleaved (rows MODE@2; their frontends' CPU in the JSON).
LOADGEN_RESULTS ?= benchmarks/results
SERVING_PROCESSES ?= 0
LOADGEN_SCALE = cartpole-64 cartpole-1024 atari-16 cartpole-4096
LOADGEN_JSONS = $(LOADGEN_RESULTS)/loadgen-cartpole.json $(LOADGEN_RESULTS)/loadgen-atari.json \
	$(foreach s,$(LOADGEN_SCALE),$(LOADGEN_RESULTS)/loadgen-scale-$(s).json)
.PHONY: loadgen loadgen-table loadgen-scale
loadgen: $(STAMP)
	$(PY) -m benchmarks.loadgen --env CartPole-v1 --streams 64 --envs 1 \
		--serving-processes $(SERVING_PROCESSES) --out $(LOADGEN_RESULTS)/loadgen-cartpole.json $(ARGS)
	$(PY) -m benchmarks.loadgen --env ALE/Pong-v5 --preset atari --streams 16 --envs 1 \
		--serving-processes $(SERVING_PROCESSES) --out $(LOADGEN_RESULTS)/loadgen-atari.json $(ARGS)
	$(MAKE) --no-print-directory loadgen-table

## The serving tier's rows (issue 86), one repeat each: CartPole-v1 64 x 1 and 1024 x 1 at
## --serving-processes 0, 1, 2 (echo beside them), Pong 16 x 1 at 0 and 2 (phases at 0 for the
## forward pass), and 4096 x 1 from LOADGEN_GENERATORS generator processes at 0 and 2;
## writes LOADGEN_RESULTS/loadgen-scale-*.json and the loadgen block.
LOADGEN_GENERATORS ?= 4
LOADGEN_SCALE_ARGS = --repeats 1 --transport tcp --connect-timeout-s 300
loadgen-scale: $(STAMP)
	$(PY) -m benchmarks.loadgen --env CartPole-v1 --streams 64 --envs 1 --modes echo,system \
		--serving-processes 0,1,2 $(LOADGEN_SCALE_ARGS) \
		--out $(LOADGEN_RESULTS)/loadgen-scale-cartpole-64.json $(ARGS)
	$(PY) -m benchmarks.loadgen --env CartPole-v1 --streams 1024 --envs 1 --modes echo,system \
		--serving-processes 0,1,2 $(LOADGEN_SCALE_ARGS) \
		--out $(LOADGEN_RESULTS)/loadgen-scale-cartpole-1024.json $(ARGS)
	$(PY) -m benchmarks.loadgen --env ALE/Pong-v5 --preset atari --streams 16 --envs 1 \
		--modes phases,system --serving-processes 0,2 $(LOADGEN_SCALE_ARGS) \
		--out $(LOADGEN_RESULTS)/loadgen-scale-atari-16.json $(ARGS)
	$(PY) -m benchmarks.loadgen --env CartPole-v1 --streams 4096 --envs 1 --modes system \
		--serving-processes 0,2 --generators $(LOADGEN_GENERATORS) \
		$(LOADGEN_SCALE_ARGS) --out $(LOADGEN_RESULTS)/loadgen-scale-cartpole-4096.json $(ARGS)
	$(MAKE) --no-print-directory loadgen-table

loadgen-table: $(STAMP)
	$(PY) -m benchmarks.loadgen table $(wildcard $(LOADGEN_JSONS)) --update docs/performance.md

## Regenerate docs/configuration.md from the config dataclasses and docs/usage.md's table of
## env families from their registry (a test fails while either is stale).
.PHONY: docs
docs: $(STAMP)
	$(PY) -m learner.tools.config_docs > docs/configuration.md
	$(PY) -m seedrl.envs.docs docs/usage.md

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache $(CPP_BUILD) bench.json bench-minatar.json \
		bench-atari.json

## An endurance run with faults (python -m benchmarks.soak; root for the network partition
## and the full disk, which are skipped with a line otherwise): SOAK_MINUTES of CartPole with
## actor and learner kills, a corrupt checkpoint, a trainer crash, a partition, a full disk
## and a fail-over to a standby; writes SOAK_JSON and its plot, renders docs/reliability.md's
## soak block and fails when a bound broke. `make soak-short`: every fault once, a few minutes (CI).
SOAK_MINUTES ?= 60
SOAK_JSON ?= benchmarks/results/soak.json
SOAK_PNG ?= docs/reliability/soak.png
SOAK_SHORT_DIR ?= runs/soak-short
.PHONY: soak soak-short soak-table
soak: $(STAMP)
	$(PY) -m benchmarks.soak --minutes $(SOAK_MINUTES) --out $(SOAK_JSON) --png $(SOAK_PNG) $(ARGS)
	$(MAKE) --no-print-directory soak-table SOAK_JSON=$(SOAK_JSON)

soak-short: $(STAMP)
	$(PY) -m benchmarks.soak --short --out $(SOAK_SHORT_DIR)/soak.json \
		--png $(SOAK_SHORT_DIR)/soak.png $(ARGS)

soak-table: $(STAMP)
	$(PY) -m benchmarks.soak table $(SOAK_JSON) --png reliability/soak.png --update docs/reliability.md
