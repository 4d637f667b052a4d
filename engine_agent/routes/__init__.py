"""The agent's HTTP routes, one `APIRouter` per resource; `engine_agent.api.create_app` mounts them."""
