"""Runners that break the bridge protocol in one way each (stdlib only, so each step costs a Python start).

``python fake_runner.py MODE MODEL CASE_DIR`` answers from the goldens the export put beside the model
(``expected_K.nxrt``, ``step.json``): ``echo`` is a conformant runtime; every other mode is one fault.
``FAKE_PID_FILE`` is where ``hang`` writes the pid of the child it leaves sleeping; ``FAKE_LOG`` (optional)
gets one JSON line per step with the sha256 of every input file; ``perturb-present`` flips the last byte
of present_compression_carry at step ``FAKE_PERTURB_STEP``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    mode, _model, case_dir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    step = json.loads((case_dir / "step.json").read_text())
    if "FAKE_LOG" in os.environ:
        inputs = {entry["name"]: hashlib.sha256((case_dir / entry["file"]).read_bytes()).hexdigest()
                  for entry in step["inputs"]}
        with open(os.environ["FAKE_LOG"], "a") as log:
            log.write(json.dumps({"step": step["step"], "inputs": inputs}) + "\n")
    if mode == "unsupported":
        print("UNSUPPORTED_OP\top type not supported by any available EP: CompressedSparseAttention")
        sys.exit(2)
    if mode == "error":
        print("ERROR\tsession failed: no CUDA device")
        sys.exit(3)
    if mode == "hang":
        child = subprocess.Popen(["sleep", "60"])
        Path(os.environ["FAKE_PID_FILE"]).write_text(f"{os.getpid()} {child.pid}")
        time.sleep(60)
    if mode == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    if mode == "silent":
        sys.exit(0)
    if mode == "mislabelled":
        print("OK\t3 outputs")
        sys.exit(3)
    if step["expect_error"] is not None and mode != "accept-all":
        print(f"ERROR\t{step['expect_error']}")
        sys.exit(3)
    for index, output in enumerate(step["outputs"]):
        target = case_dir / f"output_{index}.nxrt"
        shutil.copyfile(case_dir / output["file"], target)
        data = bytearray(target.read_bytes())
        if index == 0 and mode == "wrong":
            data[-1] ^= 0x80  # the sign bit of Y's last element
        elif index == 0 and mode == "dtype":
            data[8] = 6  # float32 (1) relabelled int32 (6): same size, another dtype
        elif index == 0 and mode == "malformed":
            data = data[:-3]
        elif (mode == "perturb-present" and output["name"] == "present_compression_carry"
              and step["step"] == int(os.environ["FAKE_PERTURB_STEP"])):
            data[-1] ^= 0x01
        elif index == 1 and mode == "missing":
            target.unlink()
            continue
        target.write_bytes(bytes(data))
    print(f"OK\t{len(step['outputs'])} outputs")


if __name__ == "__main__":
    main()
