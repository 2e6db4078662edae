use super::*;

#[test]
fn explore() {
    let l = ok(SPEC_EXAMPLE);
    println!("{}", l.config.summary());
    for w in &l.warnings {
        println!("W {w}");
    }
    println!("{:#?}", l.config.routes[0].limits);
    let bad = "listen: [0.0.0.0:8080, nope]\nworkers: -1\nstore: {backend: redis, url: http://x:pw@h, timout: 5s}\nupstreams:\n  api: {targets: [ftp://a]}\n  api: {targets: http://b}\nroutes:\n  - name: a\n    upstream: apx\n    limits:\n      - {name: x, algorithm: token_bucket, rate: ten, burts: 5}\n      - {name: x, algorithm: tokn_bucket, rate: 0/s, window: 1s}\n  - name: a\n    match: {path_prefix: v1, path: /x, methods: [G ET]}\n    upstream: api\n    strip_prefix: true\n";
    for p in problems(bad) {
        println!("E {p}");
    }
    println!("{:?}", problems("a: [1, 2\nb: c"));
    println!("{:?}", problems("- 1\n- 2"));
    println!("{:?}", ok("listen: 0.0.0.0:1\n").warnings);
}
