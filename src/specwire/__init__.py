"""specwire: EAGLE-3 speculative decoding with a wiring contract that travels with the weights.

The package is layered (each layer imports only from the ones above it):
targets/capture -> data -> draft/train -> decoding -> formats -> doctor -> front ends (cli, serve, bench).
"""

__version__ = "0.1.0"
