"""LLM hosting tools: LMI rules, rendering, sizing, streaming client, generate, loadtest, Falcon benchmark."""
