"""A worker's result frames: made one at a time, complete, and cut short by a cancel."""

from __future__ import annotations

import numpy as np

from codedgd.services.compute.gradient import CancelFlag
from codedgd.services.framing import parse
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.wire import WORKER_TENSOR_PATHS, Assembler
from codedgd.services.worker.uploads import Upload as _Upload


def _upload(payload: np.ndarray, cancel: CancelFlag, sent: list[int]) -> _Upload:
    return _Upload("job-7", 3, payload, 0.5, 0.25, cancel, chunk_bytes=800, on_sent=sent.append)


def test_the_frames_carry_the_payload_and_the_first_one_the_timings() -> None:
    payload = np.random.default_rng(0).standard_normal(250)  # 2000 bytes: 3 chunks of <= 800
    sent: list[int] = []
    frames = list(_upload(payload, CancelFlag(), sent))
    assert len(frames) == 3
    asm = Assembler("gradient", dtype="<f8", shape=(250,))
    out = None
    for i, raw in enumerate(frames):
        frame = parse(pb.WorkerMessage, raw, WORKER_TENSOR_PATHS)
        result = frame.message.result
        assert (result.job_id, result.round, result.payload.index) == ("job-7", 3, i)
        assert result.compute_seconds == (0.5 if i == 0 else 0.0)
        assert result.delay_seconds == (0.25 if i == 0 else 0.0)
        out = asm.add(result.payload, frame.data)
    assert out is not None and np.array_equal(out, payload)
    assert sum(sent) == payload.nbytes


def test_frames_are_made_as_they_are_taken_and_stop_once_the_round_is_cancelled() -> None:
    payload = np.arange(250, dtype=np.float64)
    cancel = CancelFlag()
    sent: list[int] = []
    frames = iter(_upload(payload, cancel, sent))
    next(frames)
    assert sent == [800]  # the second chunk is not framed before it is asked for
    cancel.set()
    assert list(frames) == []
    assert sent == [800]
