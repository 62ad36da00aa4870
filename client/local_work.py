"""What an agent does on its own device during a round: download the task's blobs, and compute
its contribution. Used by :class:`dpfl.client.rounds.JobWorker`; no protocol state lives here.

**Downloads.** The invitation does not say which blobs the task needs, so on acceptance the agent
fetches what exists: the model at ``model_version`` (a refusal with ``NOT_FOUND`` or an empty blob
means "no model") and, once per job, the public data (``NOT_FOUND`` means none; otherwise a
``.npy`` float32 array whose rows must have the agent's input shape, loaded without pickle).

**The contribution** is ``Algorithm.agent_contribution``: by default its real vector encoded with
the round's encoding and noise (its share under secure aggregation, the whole noise without);
DP-FedSGD adds its noise inside the local steps instead. It runs in a worker thread (the task
loop's executor) and must come back as m uint64 values below 2^r, or the round is left.
"""

from __future__ import annotations

import io
from collections.abc import MutableMapping

import numpy as np
import numpy.typing as npt

from dpfl.client.errors import DownloadError
from dpfl.client.transport import CoordinatorLink
from dpfl.learning.algorithms.base import AgentData, AnyAgent
from dpfl.mechanisms import EncodingConfig
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.secagg.errors import SecAggError
from dpfl.secagg.randomness import RandomStream

__all__ = ["Fetched", "contribution", "fetch_blobs", "parse_public"]

#: (the model's bytes or None, the job's public data or None)
Fetched = tuple[bytes | None, npt.NDArray[np.float32] | None]


async def fetch_blobs(
    link: CoordinatorLink,
    *,
    job_id: str,
    model_version: int,
    input_shape: tuple[int, ...],
    public_cache: MutableMapping[str, npt.NDArray[np.float32] | None],
) -> Fetched:
    """The model at ``model_version`` and the job's public data (fetched once per job into
    ``public_cache``); see the module docstring.

    Raises:
        DownloadError: a refusal other than ``NOT_FOUND``, or a malformed blob.
    """
    try:
        blob = await link.download(
            pb.DownloadRequest(job_id=job_id, kind=pb.BLOB_MODEL, version=model_version)
        )
        model = blob.data or None
    except DownloadError as exc:
        if exc.status != "NOT_FOUND":
            raise
        model = None
    if job_id not in public_cache:
        try:
            blob = await link.download(pb.DownloadRequest(job_id=job_id, kind=pb.BLOB_PUBLIC_DATA))
            public = parse_public(blob.data, input_shape=input_shape)
        except DownloadError as exc:
            if exc.status != "NOT_FOUND":
                raise
            public = None
        public_cache[job_id] = public
    return model, public_cache[job_id]


def parse_public(data: bytes, *, input_shape: tuple[int, ...]) -> npt.NDArray[np.float32]:
    """A public-data blob as a read-only float32 array with rows of ``input_shape``.

    Raises:
        DownloadError: not a ``.npy`` array (pickles are refused), rows of another shape, or
            values that are not finite floating-point numbers.
    """
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise DownloadError(f"the public data is not a .npy array: {exc}") from None
    shape = tuple(input_shape)
    if array.ndim < 1 or tuple(array.shape[1:]) != shape:
        raise DownloadError(
            f"the public data has rows of shape {tuple(array.shape[1:])}, this agent's data {shape}"
        )
    if not np.issubdtype(array.dtype, np.floating) or not np.isfinite(array).all():
        raise DownloadError("the public data must be finite floating-point values")
    out: npt.NDArray[np.float32] = np.ascontiguousarray(array, dtype=np.float32)
    out.flags.writeable = False
    return out


def contribution(
    side: AnyAgent,
    data: AgentData,
    *,
    fetched: Fetched,
    device: str,
    encoding: EncodingConfig,
    stream: RandomStream,
    vector_length: int,
) -> npt.NDArray[np.uint64]:
    """The agent's vector in Z_{2^r} for this round (blocking: run it in a worker thread).

    Raises:
        SecAggError: the algorithm returned something else than ``vector_length`` uint64 values
            below 2^r.
        AlgorithmError, LearningError: the algorithm's own refusals.
    """
    model, public_x = fetched
    encoded = np.asarray(
        side.contribution(
            data,
            model=model,
            public_x=public_x,
            device=device,
            encoding=encoding,
            stream=stream,
        )
    )
    if encoded.dtype != np.uint64 or encoded.shape != (vector_length,):
        raise SecAggError(
            f"the local computation gave a {encoded.dtype} vector of shape {encoded.shape}, "
            f"the round sums {vector_length} uint64 values"
        )
    ring_bits = encoding.ring_bits
    if ring_bits < 64 and int(encoded.max(initial=0)) >> ring_bits:
        raise SecAggError(f"the local contribution does not fit {ring_bits} bits")
    return encoded
