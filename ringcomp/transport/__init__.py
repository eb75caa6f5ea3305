"""The Transport and its parts: bytes on the wire under deadlines; the package mpi4py is for."""
