"""`radixlm run` (a streaming chat in the terminal, in-process or against a server) and
`radixlm list` (the models it can load). Above the runtime: it uses an Engine in this
process or a server's OpenAI API over HTTP."""
