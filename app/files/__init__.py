"""Files attached to messages: where their bytes live (:mod:`app.files.storage`), what they
are (:mod:`app.files.content`), signed URLs for local storage (:mod:`app.files.signing`), and
the rules of uploading, attaching, reading and deleting them (:mod:`app.files.service`)."""
