"""Bearer-token checks: the operator's token for policy writes, the data planes' for theirs.

Two credentials, so a data-plane pod (which must hold one) cannot rewrite policy:

    method                               needs
    SetPolicy, UploadRanking             the operator token (--token-file)
    WatchPolicy, ReportRouting           the data-plane token (--dataplane-token-file);
                                         without one, the operator token (one shared token)
    reads (GetPolicy, ListSubscribers..) none

ReportRouting is a write: routing reports move the online hotness ranking, which becomes
new policy versions pushed to every data plane. WatchPolicy registers a subscriber (the
registry is bounded, so an open watch lets anyone crowd out the real data planes) and
receives every policy and ranking. A call with more than one `authorization` header is
refused whatever they hold.
"""

from __future__ import annotations

from rimuru.rpc import BearerTokens

OPERATOR_METHODS = frozenset(
    {
        "/rimuru.v1.PolicyService/SetPolicy",
        "/rimuru.v1.PolicyService/UploadRanking",
    }
)
REPORT_ROUTING = "/rimuru.v1.PolicyDiscoveryService/ReportRouting"
WATCH_POLICY = "/rimuru.v1.PolicyDiscoveryService/WatchPolicy"


class BearerTokenInterceptor(BearerTokens):
    def __init__(self, token: str, dataplane_token: str | None = None) -> None:
        """token: the operator's; dataplane_token: the data planes' (None = see above)."""
        if not token or dataplane_token == "":
            raise ValueError("tokens must be non-empty; pass no interceptor to leave writes open")
        if dataplane_token == token:
            raise ValueError("the data-plane token must differ from the operator token")
        tokens = dict.fromkeys(OPERATOR_METHODS, token)
        tokens[REPORT_ROUTING] = tokens[WATCH_POLICY] = dataplane_token or token
        super().__init__(
            tokens,
            "policy writes: the operator token, rimuru policy --token-file PATH; data planes: "
            "theirs, rimuru serve --token-file PATH",
        )
