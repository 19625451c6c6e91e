"""elector's library against the Python lock libraries, the holder frozen past its lease: the
benchmark and its worker process."""
