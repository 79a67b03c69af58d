"""The HTTP surfaces: the users' routes and the chat socket's entry (:mod:`app.web.api`), the
chat page (:mod:`app.web.page`), the moderation API (:mod:`app.web.admin`), the backend API
(:mod:`app.web.backend_api`) and the bearer-token guard the last two share
(:mod:`app.web.bearer`)."""
