# Convenience targets; each sets up what it needs first (scripts/setup).
ITERATIONS ?= 200
CUTS ?= 1000
IMAGE_CUTS ?= 20
PIPELINE_LINES ?= 250000 1000000 4000000
FUZZ_SECONDS ?= 600
MUTATE ?=
BASE ?=

help:           ## list the targets
	@grep -E '^[a-z-]+: +## ' Makefile | sed -E 's/: +## /\t/' | expand -t 16

.PHONY: help run test provision-test update-test bench bench-quick bench-serial bench-ble bench-bridge bench-metrics bench-flood bench-mqttsn bench-wear crash-test power-test power-test-image pipeline-bench fuzz mutate docs

run:            ## start the gateway on the embedded default config
	scripts/run

test:           ## the whole test suite (what CI runs)
	scripts/test

docs:           ## the manual: regenerate its reference pages and man pages, then mkdocs build --strict into site/
	scripts/setup --test
	.venv/bin/python -m docs.gen
	.venv/bin/mkdocs build --strict --site-dir site

provision-test: ## the Ansible role against the image booted in qemu (~20 min; LEDGE_IMAGE=... reuses an image)
	scripts/setup --test
	.venv/bin/pytest -m provision tests/test_ansible_vm.py

update-test:    ## system updates of the image booted in qemu: a release kept, a broken system given up by itself, the store intact (~20 min; LEDGE_IMAGE=... reuses an image, its .raucb beside it)
	scripts/setup --test
	.venv/bin/pytest -m update tests/test_update.py

bench:          ## Ledge beside Mosquitto, all scenarios (~10 min; BASE=dir adds Ledge from that checkout of another commit to the same rounds)
	scripts/bench $(if $(BASE),--base $(BASE))

bench-quick:    ## one-minute smoke run of the benchmark (BASE=dir as for bench)
	scripts/bench --quick $(if $(BASE),--base $(BASE))

crash-test:     ## kill -9 Ledge ITERATIONS times under QoS 1/2 load and check nothing acknowledged is lost
	scripts/setup --test
	.venv/bin/python -m tests.support.crash --iterations $(ITERATIONS)

power-test:     ## cut the power under Ledge CUTS times (data_dir on a lossy FUSE file system, QoS 1/2 load, a bridge to a Mosquitto that comes and goes) and check nothing acknowledged is lost (~30 min)
	scripts/setup --test
	.venv/bin/python -m tests.support.power --cuts $(CUTS)

power-test-image: ## cut the power of the SD-card image booted in qemu IMAGE_CUTS times (its card loses what it had not flushed; fsck, store and nothing acknowledged lost checked; LEDGE_IMAGE=... reuses an image; a boot of 1-2 min per cut)
	scripts/setup --test
	.venv/bin/python -m tests.support.power_image --cuts $(IMAGE_CUTS)

bench-serial:   ## sustained line rate of one serial device (a pty) into Ledge, CPU per reading
	scripts/setup --test
	.venv/bin/python -m bench.serial

bench-ble:      ## BLE decoders beside the PyPI reference decoders; 50 devices end to end through bleak and a fake BlueZ
	scripts/setup --test
	.venv/bin/python -m bench.ble

bench-bridge:   ## the bridge's outbox during an outage and its replay to Mosquitto (100,000 messages)
	scripts/setup --test
	.venv/bin/python -m bench.bridge

bench-wear:     ## bytes and 4 KiB pages the store writes per acknowledged QoS 1 message at 10, 100, 1,000 msg/s, durability power and process (~4 min)
	scripts/setup --test
	.venv/bin/python -m bench.wear

bench-metrics:  ## gateway time per /metrics, /api/status and / scrape at 1,000 clients and 10,000 subscriptions
	scripts/setup --test
	.venv/bin/python -m bench.metrics

bench-flood:    ## 1,700 sockets that never finish CONNECT against Ledge and Mosquitto (default configs; soft open-file limit as a service gets, then this shell's)
	scripts/setup --test
	.venv/bin/python -m bench.flood --open-files 1024:$$(ulimit -Hn)
	.venv/bin/python -m bench.flood

bench-mqttsn:   ## firmware bridge: MQTT-SN/UDP vs MQTT/TCP PUBLISH/s, RSS per idle client, 1,000-client sleep soak (~12 min)
	scripts/setup --test
	.venv/bin/python -m bench.mqttsn

pipeline-bench: ## ledge-pipeline run on local[2] (fresh JVM) at 0.25M, 1M and 4M landing lines beside a single-pass PySpark reference, the bare session and DuckDB, and the floors (reading, judging; DuckDB's query in Spark SQL)
	scripts/setup --test
	.venv/bin/python -m bench.pipeline --floor $(addprefix --lines ,$(PIPELINE_LINES))

mutate:         ## mutation testing (mutmut) per package with its fast tests (MUTATE="drivers config" for some: mqtt broker bridge mqttsn metrics store drivers config); report in .mutate/report.md (hours of CPU for all)
	scripts/setup --test
	.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[mutate]"
	.venv/bin/python -m bench.mutate $(MUTATE)

fuzz:           ## coverage-guided fuzzing of codec, codec hot paths, connection state machine, WebSocket reader, HTTP listener, firmware bridge and the pipeline's landing-line judge, FUZZ_SECONDS per target
	scripts/setup --test
	.venv/bin/python -m fuzz --seconds $(FUZZ_SECONDS)
