"""The agent: chat rendering and tokenization, tool-call parsing, failure monitors and the turn loop."""
