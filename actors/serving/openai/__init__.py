"""The OpenAI API over one engine loop, in plain Python (not a Ray actor): the wire format
(``protocol``), every request field classified (``fields``), log-probabilities (``logprobs``) and the
handlers (``server``). The ``openai`` package these modules import is the client library, not this one."""
