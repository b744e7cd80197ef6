//! Wire-format properties: every frame kind round-trips, and no input — random, truncated,
//! oversized — makes the decoder panic or accept garbage silently.

use flock_ipc::*;
use proptest::prelude::*;

fn s() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), "[a-z0-9@#:_ -]{0,24}", any::<String>()]
}

fn code() -> impl Strategy<Value = ErrorCode> {
    proptest::sample::select(ErrorCode::ALL.to_vec())
}

fn ps_row() -> impl Strategy<Value = PsRow> {
    (s(), s(), any::<Option<u32>>(), any::<u64>(), any::<u32>(), any::<Option<u64>>()).prop_map(
        |(name, state, pid, n, restarts, rss)| PsRow {
            name,
            kind: "agent".into(),
            role: "worker".into(),
            pid,
            state,
            uptime_secs: n,
            restarts,
            last_exit: Some("exit(3)".into()),
            mailbox_depth: n / 3,
            turns_total: n / 2,
            rss_bytes: rss,
            ..Default::default()
        },
    )
}

fn control() -> impl Strategy<Value = ControlRequest> {
    prop_oneof![
        Just(ControlRequest::Ps),
        (proptest::option::of(s()), any::<u32>(), any::<bool>())
            .prop_map(|(agent, lines, follow)| ControlRequest::Logs { agent, lines, follow }),
        s().prop_map(|agent| ControlRequest::Stop { agent }),
        s().prop_map(|agent| ControlRequest::Start { agent }),
        s().prop_map(|agent| ControlRequest::Restart { agent }),
        (any::<u32>(), any::<u32>())
            .prop_map(|(offset, limit)| ControlRequest::DeadLetters { offset, limit }),
        Just(ControlRequest::Down),
        (s(), proptest::option::of(s()))
            .prop_map(|(agent, channel)| ControlRequest::Session { agent, channel }),
        (s(), s(), s()).prop_map(|(tool, arguments, as_name)| ControlRequest::Channel {
            tool,
            arguments,
            as_name
        }),
        any::<u128>().prop_map(|chain| ControlRequest::Watch { chain }),
        Just(ControlRequest::Chains),
        (s(), s()).prop_map(|(tool, arguments)| ControlRequest::Memory { tool, arguments }),
    ]
}

fn chain_row() -> impl Strategy<Value = ChainRow> {
    (any::<u128>(), s(), s(), any::<u32>(), any::<u64>()).prop_map(|(id, origin, text, hops, n)| {
        ChainRow {
            id,
            origin,
            entry: "coordinator".into(),
            text,
            state: "running".into(),
            hops,
            max_hops: 12,
            tokens: n,
            max_tokens: 40_000,
            age_ms: n / 2,
            max_wall_ms: 300_000,
            live: hops / 2,
        }
    })
}

fn chain_end() -> impl Strategy<Value = ChainEnd> {
    (any::<u128>(), 0u8..3, s(), s(), any::<u64>(), any::<u32>()).prop_map(
        |(chain, o, text, channel, n, hops)| ChainEnd {
            chain,
            outcome: [ChainOutcome::Answered, ChainOutcome::Stopped, ChainOutcome::Ended]
                [o as usize],
            text,
            by: "coordinator".into(),
            channel,
            seq: n,
            hops,
            tokens: n / 3,
            elapsed_ms: n / 5,
        },
    )
}

fn control_reply() -> impl Strategy<Value = ControlReply> {
    prop_oneof![
        proptest::collection::vec(ps_row(), 0..4).prop_map(ControlReply::Ps),
        proptest::collection::vec(s(), 0..4).prop_map(ControlReply::LogLines),
        proptest::collection::vec((s(), s()), 0..4).prop_map(
            |lines| ControlReply::SourcedLogLines(
                lines.into_iter().map(|(source, line)| SourcedLine { source, line }).collect()
            )
        ),
        (any::<u128>(), s(), any::<u32>()).prop_map(|(id, t, attempts)| ControlReply::DeadLetters(
            vec![DeadLetter {
                id,
                sender: "a".into(),
                target: "b".into(),
                text: t.clone(),
                attempts,
                reason: t
            }]
        )),
        s().prop_map(ControlReply::Done),
        s().prop_map(ControlReply::Json),
        proptest::collection::vec(chain_row(), 0..3).prop_map(ControlReply::Chains),
    ]
}

fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        (any::<u32>(), s(), s(), any::<u32>(), s()).prop_map(|(v, a, i, pid, t)| Body::Hello(
            Hello { protocol_version: v, agent_id: a, instance: i, pid, token: t }
        )),
        (any::<u32>(), s(), any::<u32>(), s()).prop_map(|(v, a, pid, t)| Body::BridgeHello(
            Hello { protocol_version: v, agent_id: a, instance: String::new(), pid, token: t }
        )),
        (any::<u32>(), s(), s()).prop_map(|(v, c, k)| Body::ClientHello {
            protocol_version: v,
            client: c,
            key: k
        }),
        (any::<u32>(), s(), s(), any::<u64>(), any::<u32>()).prop_map(|(v, sw, j, h, m)| {
            Body::Welcome(Welcome {
                protocol_version: v,
                swarm: sw,
                agent_spec_json: j,
                heartbeat_interval_ms: h,
                max_frame_bytes: m,
            })
        }),
        (code(), s()).prop_map(|(code, reason)| Body::Reject { code, reason }),
        (s(), 0..3u8).prop_map(|(text, m)| Body::Send {
            text,
            mode: [SendMode::Durable, SendMode::AtMostOnce, SendMode::Upkeep][m as usize]
        }),
        Just(Body::Accepted),
        (s(), any::<u64>()).prop_map(|(text, timeout_ms)| Body::Request { text, timeout_ms }),
        s().prop_map(|text| Body::Reply { text }),
        s().prop_map(|text| Body::Delegate { text }),
        (
            s(),
            s(),
            any::<u32>(),
            0u8..4,
            proptest::collection::vec(s(), 0..3),
            proptest::option::of(s()),
            proptest::option::of(s()),
            any::<Option<u128>>(),
        )
            .prop_map(
                |(sender, text, attempt, kind, call_chain, channel, answer_to, chain)| {
                    Body::Deliver(Delivery {
                        kind: [
                            DeliveryKind::Message,
                            DeliveryKind::Request,
                            DeliveryKind::Delta,
                            DeliveryKind::Result,
                        ][kind as usize],
                        sender,
                        text,
                        attempt,
                        durable: kind == 0,
                        call_chain,
                        channel,
                        answer_to,
                        chain,
                    })
                }
            ),
        s().prop_map(|channel| Body::SessionClosed { channel }),
        (s(), s()).prop_map(|(channel, messages)| Body::SessionSave { channel, messages }),
        s().prop_map(|channel| Body::SessionLoad { channel }),
        s().prop_map(|request| Body::LlmCall { request }),
        (any::<bool>(), s()).prop_map(|(ok, response)| Body::LlmResult { ok, response }),
        (s(), s()).prop_map(|(channel, messages)| Body::SessionData { channel, messages }),
        proptest::option::of(s()).prop_map(|reply| Body::Ack { reply }),
        s().prop_map(|reason| Body::Nack { reason }),
        s().prop_map(|reason| Body::Cancel { reason }),
        (s(), s()).prop_map(|(name, arguments)| Body::ToolCall { name, arguments }),
        (any::<bool>(), s()).prop_map(|(ok, content)| Body::ToolResult { ok, content }),
        Just(Body::Heartbeat),
        Just(Body::HeartbeatAck),
        Just(Body::Shutdown),
        Just(Body::ShutdownAck),
        Just(Body::Rewind),
        (code(), s()).prop_map(|(code, message)| Body::Error { code, message }),
        control().prop_map(Body::Control),
        control_reply().prop_map(Body::ControlReply),
        chain_end().prop_map(Body::ChainEnded),
    ]
}

fn frame() -> impl Strategy<Value = Frame> {
    (any::<u128>(), s(), s(), any::<Option<u128>>(), any::<Option<u64>>(), body()).prop_map(
        |(id, from, to, correlation_id, deadline_ms, body)| Frame {
            id,
            from,
            to,
            correlation_id,
            deadline_ms,
            body,
        },
    )
}

fn read_all(bytes: &[u8], max: u32) -> Result<Vec<Frame>, FrameError> {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async {
        let mut reader = FrameReader::new(bytes, max);
        let mut out = Vec::new();
        while reader.read_batch(&mut out).await? > 0 {}
        Ok(out)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_frame_kind_round_trips(f in frame()) {
        let mut buf = Vec::new();
        encode_frame(&f, &mut buf).unwrap();
        prop_assert_eq!(u32::from_le_bytes(buf[..4].try_into().unwrap()) as usize, buf.len() - 4);
        prop_assert_eq!(decode_frame(&buf[4..]).unwrap(), f);
    }

    #[test]
    fn a_stream_of_frames_round_trips_in_order(frames in proptest::collection::vec(frame(), 0..20)) {
        let mut buf = Vec::new();
        for f in &frames {
            encode_frame(f, &mut buf).unwrap();
        }
        prop_assert_eq!(read_all(&buf, DEFAULT_MAX_FRAME_BYTES).unwrap(), frames);
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        // Either some frames then an error, or a clean decode; never a panic or an abort.
        let _ = read_all(&bytes, DEFAULT_MAX_FRAME_BYTES);
        let _ = decode_frame(&bytes);
    }

    #[test]
    fn truncated_streams_are_reported_not_hidden(f in frame(), cut in 1usize..64) {
        let mut buf = Vec::new();
        encode_frame(&f, &mut buf).unwrap();
        let cut = cut.min(buf.len() - 1);
        let err = read_all(&buf[..buf.len() - cut], DEFAULT_MAX_FRAME_BYTES).unwrap_err();
        let is_truncated = matches!(err, FrameError::Truncated { .. });
        prop_assert!(is_truncated, "got {err}");
    }
}

#[test]
fn oversized_length_is_rejected_before_reading_the_body() {
    let mut bytes = (1024u32 + 1).to_le_bytes().to_vec();
    bytes.extend_from_slice(&[0; 16]);
    let err = read_all(&bytes, 1024).unwrap_err();
    assert!(matches!(err, FrameError::TooLarge { len: 1025, max: 1024 }), "{err}");
}

#[test]
fn huge_claimed_string_does_not_allocate_or_panic() {
    // A Send whose text claims u64::MAX bytes: bincode must refuse, not try to allocate.
    let f = Frame::new("a", "b", Body::Send { text: "x".into(), mode: SendMode::Durable });
    let mut buf = Vec::new();
    encode_frame(&f, &mut buf).unwrap();
    let body = &mut buf[4..];
    // Find the text's length byte (1) followed by 'x' and replace it with a varint u64::MAX.
    let pos = body.windows(2).position(|w| w == [1, b'x']).unwrap();
    let mut forged = body[..pos].to_vec();
    forged.push(253); // bincode varint marker for u64
    forged.extend_from_slice(&u64::MAX.to_le_bytes());
    forged.extend_from_slice(&body[pos + 1..]);
    assert!(matches!(decode_frame(&forged), Err(FrameError::Decode(_))));
}

#[test]
fn trailing_garbage_after_a_body_is_an_error() {
    let f = Frame::new("a", "b", Body::Heartbeat);
    let mut buf = Vec::new();
    encode_frame(&f, &mut buf).unwrap();
    let mut body = buf[4..].to_vec();
    body.push(0);
    assert!(matches!(decode_frame(&body), Err(FrameError::Decode(_))));
}

#[test]
fn large_frames_grow_the_buffer_and_decode() {
    let text = "y".repeat(3 * 1024 * 1024);
    let f = Frame::new("a", "b", Body::Send { text, mode: SendMode::Durable });
    let mut buf = Vec::new();
    encode_frame(&f, &mut buf).unwrap();
    assert_eq!(read_all(&buf, DEFAULT_MAX_FRAME_BYTES).unwrap(), vec![f]);
}
