"""Where arrays live: device arrays and their host staging, the stand-in device, placement."""
