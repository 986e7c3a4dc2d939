"""The engine over the network: `parley serve` (the OpenAI-compatible HTTP API) and `parley web` (the chat app in
a browser, each tab a `parley chat --server` over one `parley serve`)."""
