"""The real trace sets rayfl knows by name: where each file comes from (a pinned commit of its public source), its
SHA-256, its licence file, and which sets ship inside the package.

A shipped set's files, its licence and a ``SOURCE.md`` (origin, citation, licence, format, what was left out and why)
are in ``rayfl/traces/data/NAME`` and go into the wheel as package data, so a clone with no network replays them.
Only sets whose licence allows redistribution ship, each whole or as a named selection small enough to keep the
clone light (``subset_of``); the others are fetched into the cache (``rayfl.traces.sets``). Every set's licence file
is one of its files, so a fetched copy carries it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["SHIPPED_ROOT", "TRACE_SETS", "TraceSet"]

SHIPPED_ROOT = Path(__file__).resolve().parent / "data"  # rayfl/traces/data/NAME: the sets that ship with rayfl


@dataclass(frozen=True, kw_only=True)
class TraceSet:
    """A published set: where its files are (``base_url`` + each file's remote path) and their SHA-256."""

    name: str
    base_url: str
    files: dict[str, str]  # local name -> SHA-256, the licence file included
    licence: str  # the licence file among ``files``: it goes with every copy of the set
    remote: dict[str, str] = field(default_factory=dict)  # local name -> path under base_url (default: the name)
    about: str = ""
    shipped: bool = False  # every file is in SHIPPED_ROOT / name (the wheel's package data): no fetch, no network
    subset_of: str = ""  # the larger set this one is a shipped selection of

    def remote_path(self, name: str) -> str:
        return self.remote.get(name, name)


_MAHIMAHI = "https://raw.githubusercontent.com/ravinet/mahimahi/ae477d437615b972217498ba52be07db17a15618/"
_MAHIMAHI_FILES = {
    "ATT-LTE-driving-2016.down": "24a40538340de991e0a6595aefc381b11a3da0446176e69b51750707a57b0344",
    "ATT-LTE-driving-2016.up": "ebb3d53674b77be4ed920ad91c4513a496e04e30da839e2ca8a627cb7269071e",
    "ATT-LTE-driving.down": "73c58f41bf7a3f0fac82810ca61307521be1cf6b77a0e98093fd340bddfd161f",
    "ATT-LTE-driving.up": "d58a640b9bccd131a421bff6eaf727aba324d9258b35009655bbf68e087b9b29",
    "TMobile-LTE-driving.down": "d48ff134fc29c36cc3c3dee203464246bd698f0faede42534a27b0cbe3057055",
    "TMobile-LTE-short.down": "4f33dce8dd811b5702272af64aaf64d3913719919abd776edf1e0f7c0965da43",
    "TMobile-LTE-short.up": "1c0d1bf5417b07597724fd64afe676af3c1f337a4ccdde90106bf96b1bcf18b2",
    "TMobile-UMTS-driving.down": "c97a74e7e6cf593d93b59f73db614bc6186bef510531636ad9961a3b9fc18024",
    "TMobile-UMTS-driving.up": "f2dc7c8e57f4cf525fefaff2d68c18a9118fd1382ce9c240b1d324a2a60f8a65",
    "Verizon-EVDO-driving.down": "60c9cd7b5d8be7d89d3807052a043f54787958f04cfd4c6c16fcdac6e2c3b9da",
    "Verizon-EVDO-driving.up": "6055d60d234030035f59475dc1d39d99e7c2817b9fa5d485f1f0710b1aae2075",
    "Verizon-LTE-short.down": "c918436fbd6246af134c76585d9395881fdd27203c59a8902b9a7c675b8a8e3e",
    "Verizon-LTE-short.up": "f6cd9049f58d70f12545772a3482ded085b6d50f06a2f4ff4afcfb6fe7976dcc",
}
_MAHIMAHI_COPYING = {"COPYING": "8ceb4b9ee5adedde47b31e975c1d90c73ad27b6b165a1dcd80c7c545eb65b903"}
# The lite selection: two LTE links (AT&T, Verizon) and one 3G link (Verizon EVDO), each down and up, 0.5 to 6 Mbit/s
# on average: 2.0 MB of the full set's 11.7 MB (TMobile-LTE-short alone is 2.2 MB, ATT-LTE-driving.down 2.3 MB).
_MAHIMAHI_LITE = [
    "ATT-LTE-driving-2016.down",
    "ATT-LTE-driving-2016.up",
    "Verizon-EVDO-driving.down",
    "Verizon-EVDO-driving.up",
    "Verizon-LTE-short.down",
    "Verizon-LTE-short.up",
]
_MOBILEBANDWIDTH = "https://raw.githubusercontent.com/mobilebandwidth/mobilebandwidth.github.io/ac6aed5d8fd7c20f776b4fe8c848b79966cf773f/"
_MOBILEBANDWIDTH_FILES = {
    "4G.csv": "e01057781199852215959e2a79748d5fa3b2184fc168d41c5a76341a88932556",
    "5G.csv": "cbfa3ab3ac14ec3b883d3a0a71108b4b78e6eb323e4673192e00afb22818082f",
    "wifi4.csv": "f9490311019386beea1228f299152d88af66b7c7c43b607ae71911429c5d0c9d",
    "wifi5.csv": "3b2f17cd5acf47f329e14e67a805de369279b5f6afea75b4fa7798f433643335",
    "wifi6.csv": "597227a30377fd71a2a1a8f334a2a3f2daa346f7a65f76fc77d335d0be1ba1dc",
}
_PENSIEVE = "https://raw.githubusercontent.com/hzy46/pensieve/29bb3103cfe77e8a9011778b39b92d2d53aad42b/"
# The 59 FCC traces of Pensieve's training set (cooked_traces/trace_*; its Norway HSDPA traces, of unclear licence,
# are left out).
_PENSIEVE_FCC_FILES = {
    "trace_10322_http---edition.cnn.com": "40851cd582c52574d38ebf2083ecf3efddbbfb34618a366a581f866d73b4b8b8",
    "trace_10367_http---www.facebook.com": "05783f9c2488faef386ce646a408e34b09c498d85e8baaaf5a6f2d9b6ed5464c",
    "trace_10730_http---www.facebook.com": "02a354054981da7f80df8eee49d7730fda2e34679c348b705bcb2fb4d24d053f",
    "trace_11332_http---www.facebook.com": "bbda7569dc9b3f8683bcb9be635cf68e778cb489bd8a387c407343ca7bb47410",
    "trace_13092_http---www.amazon.com": "d7b16ee9eda08118358e30ef5d8dc53f2b17e1be376fbee23ede82a778821b1a",
    "trace_13562_http---www.facebook.com": "379686e027bedaca4b215af68d8965270c86cb74b68ea6c76aecf3fc9a9ec2e9",
    "trace_14679_http---www.facebook.com": "8c9428ab536eb82b95f1b9c94ab501e6b2ece9068daa7f20c29f073a5f41049d",
    "trace_207336_http---www.amazon.com": "2bb3509f86d385c466749c883447fb0c4e465f50f3c409b15799ace74b0914de",
    "trace_213586_http---www.facebook.com": "9c9749ac4359d124f0e376781a8719cd4be083cb92934498d8c951e59e90e12e",
    "trace_214390_http---www.amazon.com": "ae0140bbbe92c358d693bf95306016021b9766c3ac04a693979f858f12014d9d",
    "trace_215252_http---www.msn.com": "d018bf7739b9a8a92cd5a5ef43fd9e8f068491f93451d18ce604b1d0a0986af1",
    "trace_216826_http---www.amazon.com": "3fdd93c4c35eece9a703473fb565118f462f08dfd0813bd6e7768ba0d03c7b52",
    "trace_26689_http---www.amazon.com": "1a2c4843a927969c1ad2590803a0a5ec915299c7c3aa311d6c58b84ec22e9f5f",
    "trace_28838_http---www.amazon.com": "4dd3c24d94d71958fea9ced00da7e9057d863aba52433739356a5e508bbda2e7",
    "trace_28919_http---www.google.com-mobile-": "14d096fc3ec51eba787c32ec45d4a41969803b61c9b2f3d62387dc2b2d94d948",
    "trace_30637_http---www.amazon.com": "1b66bc0fa4f7b3d75b3322a1a90b41c5eb9c7e026a2b06884a94c28a98015028",
    "trace_32551_http---www.amazon.com": "da82634f685200370f072130f18dea96359b4d19ebde23d3e07ba7ffcd7abadc",
    "trace_397686_http---www.facebook.com": "49666e2f50053268864fed9a22a5134517ec57fb89420598300aa24b40d2bc71",
    "trace_5294_http---www.youtube.com": "cc641e8e6dbc6e14e28b100c6ab44bf8ca765d763a6ce01c144cb027917e649e",
    "trace_5642_http---www.youtube.com": "17aec68692875a0752e181460fe75d8ef3935b259ffdfa54bb9b4a1513017b87",
    "trace_632966_http---www.yahoo.com": "92dbf9faf2d1d928891c05dedda6f6047ea9c389dad2276960e6f8ab5567be16",
    "trace_663494_http---www.facebook.com": "ee04eff0a3f46bdbd278dd4f650aae98e6c49edcb4e15b9a338b3c81631d9a66",
    "trace_665192_http---www.facebook.com": "6efa8c29d2cae0efb50070ec43b309c184a686bf929da5f0ad20d008c42ddc66",
    "trace_665208_http---www.yahoo.com": "3db3c0a577affc5ea5dbaa5a2dbb98cce7a1627b4f4e38e04c3d431e25afcd82",
    "trace_6780_http---www.facebook.com": "d35ab8ff3a5e7c92ddde855cf178ca65de3e8dd531bb8ef75c300aa2d4874a39",
    "trace_7190_http---www.yahoo.com": "b476b7c36d9b47426cb3f48de79c1102ca96b906e1ec82add1094c483cb20d50",
    "trace_7256_http---www.facebook.com": "091a27b6740bc25f1af9d970876e84541ab0452c05306b4a85a0612d2d7ee60f",
    "trace_7289_http---www.yahoo.com": "257670fe75a8af7dd13aabe889f98ada1f091cdcfb2d55336749f3f8db4237c5",
    "trace_7451_http---www.yahoo.com": "84f9d049086103f78ae0cbfcec0940b5d75b8e2e2df9c8833c70571212e58aa2",
    "trace_7540_http---www.yahoo.com": "15206713a67390f806be501c6d6d54ea6673aa9c0f04bfcbbba17d0a0cc2a163",
    "trace_797172_http---www.yahoo.com": "cf64e24c6cd5be1505a578f4750fcaa9b793fa36b37be9365ca40f512bde3f5f",
    "trace_797466_http---www.amazon.com": "1f1c1fe246b2643b640e43d5cbca0a862c88a48b62ef41b57303c86236d50443",
    "trace_797700_http---www.yahoo.com": "77ccedcfb7b3f48fa0c64eb97c6807b73fd2e5c53a757a4b53029a9c67b2ab0c",
    "trace_799296_http---www.amazon.com": "d7dc9f82b37c226c2c2aa4d5cbb396e7d28424822922536da961a1dfced82f54",
    "trace_799448_http---www.facebook.com": "8862624cfaa58900364d10bab5b52ff5926ae739d110787fd09bd71be68bb033",
    "trace_805936_http---www.youtube.com": "daec0d4efefb037c8a2800fd6992a3670524e2523dfe3d9874e686ecff77bcd3",
    "trace_806172_http---www.amazon.com": "b1b83a5aebd737ca937d9af6a56c96855fb04a66d8b2692f8d201b115a7bf74e",
    "trace_806330_http---www.amazon.com": "d9d3eb7926a2b76dfce3d7e88bb4d463705d0f918dc696f209e6fb923178ea33",
    "trace_8299_http---www.amazon.com": "7331995b0f97eb7d33585e9a424dbcb52661530c756299d0e6b7508d37742929",
    "trace_849842_http---www.facebook.com": "1631aa3b5eef1ae4ce813e4b078e69ee6d13139fad55bb7a8cae2041998b89b6",
    "trace_866_http---www.amazon.com": "f49c9bc75daa6ee3a19cbcbfb8bf4b6ca9832a83ca068e023abf6ad31281ae9b",
    "trace_87304_http---www.msn.com": "790e571c82fa4a50b6df11192c5a78892cf3f28b9b3bfaeb56b0eab663786f65",
    "trace_8747_http---www.amazon.com": "adc54754e0e0f6b4a80449b67972f48466ccb0d4508f23371ed40b70c7e3f59e",
    "trace_8996_http---www.facebook.com": "14e90ea472fa2672f9527aa1b4ba32bab5b690d6f2b7ed1fc4fa37d3b606c4f5",
    "trace_901648_http---www.amazon.com": "f49805deeca6af10203b7f9ddc6ce9590a3179ca559de74a9b9afcdb6b5bed85",
    "trace_909_http---www.yahoo.com": "731d209a21f238bbfa7c910d4bf6494a8596f7800e92b0e49a576239ac766c25",
    "trace_925800_http---www.ebay.com": "3ce125ff9bfb8e6be97bf817a39a2ca1726692f7c751c47052865abbb6c6bca7",
    "trace_925806_http---www.amazon.com": "d76e64e9a42bfe4c900fa249214b824a0e28cd230c46e2ff512c2cc9c7646806",
    "trace_925960_http---www.ebay.com": "c58dd269d663c9a087cf28a4aaa1fcc652c1dcf4cbfd27c8485cae1b8b9f5d98",
    "trace_9370_http---www.youtube.com": "23ebe015f4b9d670d38c173ee05dbfb508678d48228d0e1b313dad0ae4892424",
    "trace_939562_http---www.google.com-mobile-": "641f470e2eb4dce4c8dda7a14c2f02036875366f52d7bc66df48e67c36e112fb",
    "trace_939592_http---www.facebook.com": "f4a4621dff77390dcb47ff8af4ce7db7021e5d118b4f62973787c4f1c229f354",
    "trace_939618_http---www.amazon.com": "2058b375ab7f7a652e6ce73e245529b4379ab4b44f0d418ebd2806a66864b882",
    "trace_940760_http---www.youtube.com": "b46e8d10477821eab4de083d403696fdf13fa089dccf64c6aae5f4216899437e",
    "trace_941752_http---www.facebook.com": "303d8ed11073b0e792c094ed1b687bc4a8ee138618d783e34ad57766739f7e6e",
    "trace_941778_http---www.youtube.com": "da175ada568ddbb36b722429280c6e64dff489f0b0a7151949c0d00acc06bc6b",
    "trace_942092_http---www.facebook.com": "c14b2f09054f0d28121dccbada80a2d917c8fda439a3c51b717f9645c229ba71",
    "trace_942154_http---www.ebay.com": "b1286bba4313c495ce43a8525b2ed7578cf0264915ed8cd231886593fd933962",
    "trace_942598_http---www.youtube.com": "111902bb6202f7df990455feab0098899c5e7b0a9e0ab93881e8d5d4f293776d",
}
_FLASH = "https://raw.githubusercontent.com/PKU-Chengxu/FLASH/55cbede0131877b583ed55333e980985a1925afd/"

TRACE_SETS: dict[str, TraceSet] = {
    "mahimahi-cellular": TraceSet(
        name="mahimahi-cellular",
        base_url=_MAHIMAHI,
        files={**_MAHIMAHI_FILES, **_MAHIMAHI_COPYING},
        licence="COPYING",
        remote={name: f"traces/{name}" for name in _MAHIMAHI_FILES},
        about="13 US cellular link traces (LTE/UMTS/EVDO, down and up) shipped with Mahimahi, GPL-3.0; format: "
        "mahimahi",
    ),
    "mahimahi-cellular-lite": TraceSet(
        name="mahimahi-cellular-lite",
        base_url=_MAHIMAHI,
        files={**{name: _MAHIMAHI_FILES[name] for name in _MAHIMAHI_LITE}, **_MAHIMAHI_COPYING},
        licence="COPYING",
        remote={name: f"traces/{name}" for name in _MAHIMAHI_LITE},
        about="6 of mahimahi-cellular's traces (AT&T LTE 2016, Verizon LTE short, Verizon EVDO; down and up), "
        "GPL-3.0; format: mahimahi",
        shipped=True,
        subset_of="mahimahi-cellular",
    ),
    "mobilebandwidth-sigcomm22": TraceSet(
        name="mobilebandwidth-sigcomm22",
        base_url=_MOBILEBANDWIDTH,
        files={
            **_MOBILEBANDWIDTH_FILES,
            "LICENSE.txt": "1b2961567cb762692cc23af8f6675f09fc808c3adda33d32de9d41aa7102a1c8",
        },
        licence="LICENSE.txt",
        remote={name: f"data/{name}" for name in _MOBILEBANDWIDTH_FILES},
        about="50,000 phone bandwidth tests (4G, 5G, Wi-Fi 4/5/6), SIGCOMM'22, Apache-2.0; format: mobilebandwidth "
        "(a distribution)",
    ),
    "fcc-pensieve": TraceSet(
        name="fcc-pensieve",
        base_url=_PENSIEVE,
        files={**_PENSIEVE_FCC_FILES, "LICENSE": "8a800d1aaa13c9099f9636b0950b4d8f5620b05b9b6dce214c1b40cedaef42ae"},
        licence="LICENSE",
        remote={name: f"cooked_traces/{name}" for name in _PENSIEVE_FCC_FILES},
        about="59 FCC broadband throughput traces (Pensieve's training set), MIT; format: pensieve",
        shipped=True,
    ),
    "flash-device-network": TraceSet(
        name="flash-device-network",
        base_url=_FLASH,
        files={
            "speed_distri.json": "63f9e869b34ceb3fb845f755b48018f55941a1b002c02abb21255d9bf5bedea4",
            "LICENSE.md": "1a80b0a9a4c6f77fff0e773c2660d909a11fb713e2913bbc883da40f4263d45d",
        },
        licence="LICENSE.md",
        remote={"speed_distri.json": "models/speed_distri.json"},
        about="download/upload speed (mean, std) of 19 real phones (FLASH, WWW'21), BSD-2-Clause; read with "
        "rayfl.traces.FlashSpeedSampler",
        shipped=True,
    ),
}
