"""Composable, resumable readers; async prefetch; worker processes; shards; datagen.

See docs/data.md. Typical chain::

    from hotloop.data import from_arrays, prefetch
    reader = from_arrays({"inputs": x}).shuffle(1024, seed=1).map(fn, workers=2).batch(32)
    for batch in prefetch(reader, capacity=2, device="cpu"):
        ...
"""
from .collate import collate, pad_stack
from .download import default_data_dir, default_raw_dir, download, file_digest, verify_file
from .errors import ChecksumError, DataError, ReaderError, WorkerError
from .prefetch import FeedStats, Prefetcher, SyncFeeder, prefetch, to_device
from .reader import Reader
from .shards import RaggedArray, ShardWriter, manifest_matches, open_array, read_manifest
from .sources import from_arrays, from_generator, from_shards, stream_windows
from .speedtest import SpeedTestFeeder, speed_test
from .stages import bucket_boundaries

__all__ = ["Reader", "from_arrays", "from_generator", "from_shards", "stream_windows",
           "prefetch", "Prefetcher", "SyncFeeder", "FeedStats", "to_device",
           "speed_test", "SpeedTestFeeder", "collate", "pad_stack", "bucket_boundaries",
           "DataError", "ChecksumError", "ReaderError", "WorkerError",
           "ShardWriter", "RaggedArray", "manifest_matches", "open_array", "read_manifest",
           "default_data_dir", "default_raw_dir", "download", "file_digest", "verify_file"]
