"""Training data every backend reads: `primus data prepare` tokenizes text into the indexed
format (PREFIX.bin with the token ids, PREFIX.idx with the document index) and a manifest
(PREFIX.json). numpy, tokenizers and pyarrow are imported only when a command needs them."""
