from tests.support.fixtures import *  # noqa: F403
from tests.support.served import serve_app  # noqa: F401
