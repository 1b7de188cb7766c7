"""The trisque client library (docs/client.md): ``client.blocking.Client`` on sockets and
threads, ``client.aio.AsyncClient`` on trio, the same API. Import the module you use: the
package imports nothing, so ``trisque`` loads only its reply parser (``client.typed_reply``)."""
