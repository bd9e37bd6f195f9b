"""Can `mlxd serve` listen on its --host and --port? Asked before the model loads, so a port
another server holds costs a one-line error at once, not a model load and uvicorn's traceback."""

import errno
import socket


def port_problem(host: str, port: int) -> str | None:
    """None when every address `host` names can be bound at `port` now (the addresses uvicorn
    will listen on: asyncio's getaddrinfo, SO_REUSEADDR, IPv6 only on IPv6); else one line
    saying what is wrong and what to do."""
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (socket.gaierror, UnicodeError) as e:
        return f"cannot listen on {host}: {getattr(e, 'strerror', None) or e}; check --host"
    for family, kind, proto, _, address in dict.fromkeys(infos):
        try:
            sock = socket.socket(family, kind, proto)
        except OSError:  # a family this machine lacks (IPv6 off): asyncio skips it too
            continue
        try:
            # A port a closed server left in TIME_WAIT is free to uvicorn, which sets this too.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
        except OSError as e:
            return _why(host, port, e)
        finally:
            sock.close()
    return None


def _why(host: str, port: int, e: OSError) -> str:
    where = f"{host}:{port}"
    if e.errno == errno.EADDRINUSE:
        return (
            f"port {port} is already in use on {host} (another mlxd or mlx_lm.server?): stop "
            f"that server, or serve on another port with --port"
        )
    if e.errno == errno.EACCES:
        return f"no permission to listen on {where}: pick a port above 1023 with --port"
    if e.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {where}: {host} is not an address of this machine; check --host"
    return f"cannot listen on {where}: {e.strerror or e}; check --host and --port"
