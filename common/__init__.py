"""Helpers both products use (training and inference): argparse types, child processes and stop signals, and the
filter for library warnings nobody can act on. Nothing here imports either product."""
