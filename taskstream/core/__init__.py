"""The shared kernel: specs, settings, states, stream protocol, store. Imports no other package."""
