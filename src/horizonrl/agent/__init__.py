"""The agent: the turn loop and its failure monitors (chat rendering is :mod:`horizonrl.chat`, tool-call
parsing :mod:`horizonrl.toolcalls`)."""
