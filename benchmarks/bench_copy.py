"""The anchor: device-to-device copy bandwidth (bytes read + written per second)."""

from .common import select_device

MIB = 1 << 20


class Copy:
    """Measured once per environment in setup_cache; time and bandwidth are two views of it."""

    param_names = ["mib"]
    params = [[64, 256]]
    timeout = 300
    version = 1

    def setup_cache(self):
        from b70bench import bandwidth  # torch only where it measures (see bench_allreduce)

        dev = select_device()
        return {mib: bandwidth.measure(dev, mib * MIB) for mib in self.params[0]}

    def track_time(self, cache, mib):
        return {"samples": cache[mib]["samples_s"], "number": 1}

    track_time.unit = "seconds"

    def track_bandwidth(self, cache, mib):
        return cache[mib]["bandwidth_gbps"]

    track_bandwidth.unit = "GB/s"
