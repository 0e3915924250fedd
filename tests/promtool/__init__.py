"""The promtool unit tests of the alert and recording rules, as data: realistic input series
for every alert and what must happen (tests/test_alerts_promtool.py renders and runs them).

One module per rule group: memory, creep, traffic, faults, liveness, recording, fleet;
``model`` holds the Scenario/Check/Expected machinery, ``render`` turns a TestFile into
promtool's YAML, ``series`` builds input series. Each TestFile is one promtool file, with one
evaluation interval.
"""

from __future__ import annotations

from tests.promtool.creep import (
    CACHE_SCENARIOS,
    CREEP_SCENARIOS,
    FAST_CREEP_SCENARIOS,
    GRAPH_SCENARIOS,
)
from tests.promtool.faults import FAULT_SCENARIOS
from tests.promtool.fleet import FLEET_RECORDING_SCENARIOS, FLEET_SCENARIOS
from tests.promtool.liveness import LIVENESS_SCENARIOS
from tests.promtool.memory import MEMORY_SCENARIOS
from tests.promtool.model import TestFile
from tests.promtool.recording import RECORDING_SCENARIOS
from tests.promtool.traffic import (
    QUEUE_WAIT_SCENARIOS,
    SATURATION_SCENARIOS,
    STEADY_SCENARIOS,
    TRAFFIC_SCENARIOS,
)

TEST_FILES: tuple[TestFile, ...] = (
    TestFile("recording.yml", "1m", RECORDING_SCENARIOS),
    TestFile("memory.yml", "15s", MEMORY_SCENARIOS),
    TestFile(
        "traffic.yml",
        "1m",
        SATURATION_SCENARIOS + QUEUE_WAIT_SCENARIOS + TRAFFIC_SCENARIOS + STEADY_SCENARIOS,
    ),
    TestFile("faults.yml", "1m", FAULT_SCENARIOS),
    TestFile("liveness.yml", "1m", LIVENESS_SCENARIOS),
    # Two files for one group: a mutation of the time-to-OOM rule reruns only its own hours.
    TestFile("creep.yml", "1m", CREEP_SCENARIOS),
    TestFile("fast_creep.yml", "5s", FAST_CREEP_SCENARIOS),
    TestFile("cache.yml", "1m", CACHE_SCENARIOS + GRAPH_SCENARIOS),
    TestFile("fleet.yml", "1m", FLEET_RECORDING_SCENARIOS + FLEET_SCENARIOS),
)
