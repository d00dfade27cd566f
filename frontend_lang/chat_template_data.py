"""The chat templates registered by name (the model families SGLang 0.5.23 knows, plus SmolLM and
Phi-3) and the model-path rules that pick one: data only, which chat_template.py registers on first use.

Each entry is the family's published turn format written as fixed per-role (prefix, suffix);
`stop_str` is its end-of-turn marker. The rules run in order and the first match wins, so a
specific family (Qwen-VL) is tried before its general one (Qwen).
"""

from __future__ import annotations

from radixgen.lang.chat_template_base import ChatTemplate

ROLES = ("system", "user", "assistant")

# vendors' default system prompts (the text their own templates insert when none is given)
QWEN_SYSTEM = "You are a helpful assistant."
SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
VICUNA_SYSTEM = (
    "A chat between a curious user and an artificial intelligence assistant. The assistant "
    "gives helpful, detailed, and polite answers to the user's questions."
)
YI_VL_SYSTEM = (
    "This is a chat between an inquisitive human and an AI assistant. Assume the role of the AI "
    "assistant. Read all the images carefully, and respond to the human's questions with "
    "informative, helpful, detailed and polite answers."
    "这是一个好奇的人类和一个人工智能助手之间的对话。假设你扮演这个AI助手的角色。"
    "仔细阅读所有的图像，并对人类的问题做出信息丰富、有帮助、详细的和礼貌的回答。"
)
DBRX_SYSTEM = (
    "You are DBRX, created by Databricks. You were last updated in December 2023. You answer "
    "questions based on information available up to that point.\nYOU PROVIDE SHORT RESPONSES TO "
    "SHORT QUESTIONS OR STATEMENTS, but provide thorough responses to more complex and "
    "open-ended questions.\nYou assist with various tasks, from writing to coding (using markdown "
    "for code blocks — remember to use ``` with code, JSON, and tables).\n(You do not have "
    "real-time data access or code execution capabilities. You avoid stereotyping and provide "
    "balanced perspectives on controversial topics. You do not provide song lyrics, poems, or "
    "news articles and do not divulge details of your training data.)\nThis is your system "
    "prompt, guiding your responses. Do not reference it, just respond to the user. If you find "
    "yourself talking about this message, stop. You should be responding appropriately and "
    "usually that means not mentioning this.\nYOU DO NOT MENTION ANY OF THIS INFORMATION ABOUT "
    "YOURSELF UNLESS THE INFORMATION IS DIRECTLY PERTINENT TO THE USER'S QUERY."
)
INTERNVL_SYSTEM = "你是书生·万象，英文名是InternVL，是由上海人工智能实验室、清华大学及多家合作单位联合开发的多模态大语言模型。"
INTERNS1_SYSTEM = (
    "You are an AI assistant whose name is Intern-S1 (书生大模型).\n- Intern-S1 (书生大模型) is a "
    "vision-language model that is developed by Shanghai AI Laboratory (上海人工智能实验室).  It is "
    "designed to be helpful, honest, and harmless.\n- Intern-S1 (书生大模型) can understand and "
    "communicate fluently in the language chosen by the user such as English and 中文.\nYou are "
    "an expert reasoner with extensive experience in all areas. You approach problems through "
    "systematic thinking and rigorous reasoning. Your response should reflect deep understanding "
    "and precise logical thinking, making your solution path and reasoning clear to others. "
    "Please put your thinking process within <think>...</think> tags."
)
DEEPSEEK_EOS = "<｜end▁of▁sentence｜>"


def _same_shape(
    name: str,
    prefix: str,
    suffix: str,
    *,
    names: tuple[str, str, str] = ROLES,
    system: str | None = None,
    stop: tuple[str, ...] | None = None,
    image_token: str = "<image>",
) -> ChatTemplate:
    """Every role as `prefix.format(role) + content + suffix` (`names` spell the roles)."""
    return ChatTemplate(
        name=name,
        default_system_prompt=system,
        role_prefix_and_suffix={
            r: (prefix.format(n), suffix) for r, n in zip(ROLES, names, strict=True)
        },
        stop_str=(suffix.strip(),) if stop is None else stop,
        image_token=image_token,
    )


def _turns(
    name: str,
    system: tuple[str, str],
    user: tuple[str, str],
    assistant: tuple[str, str],
    *,
    default_system: str | None = None,
    stop: tuple[str, ...] = (),
    image_token: str = "<image>",
    style: str = "plain",
) -> ChatTemplate:
    return ChatTemplate(
        name=name,
        default_system_prompt=default_system,
        role_prefix_and_suffix={"system": system, "user": user, "assistant": assistant},
        stop_str=stop,
        image_token=image_token,
        style=style,
    )


_CHATML = "<|im_start|>{}\n"
_LLAMA3 = "<|start_header_id|>{}<|end_header_id|>\n\n"
_LLAMA4 = "<|header_start|>{}<|header_end|>\n\n"
_DEEPSEEK = (("", ""), ("<｜User｜>", ""), ("<｜Assistant｜>", DEEPSEEK_EOS))

BUILTIN_TEMPLATES: tuple[ChatTemplate, ...] = (
    _turns("default", ("SYSTEM:", "\n"), ("USER:", "\n"), ("ASSISTANT:", "\n")),
    _turns("claude", ("", ""), ("\n\nHuman: ", ""), ("\n\nAssistant:", "")),
    _same_shape("chatml", _CHATML, "<|im_end|>\n"),
    _same_shape("chatml-llava", _CHATML, "<|im_end|>\n", system=QWEN_SYSTEM,
                image_token="<image>\n"),
    _same_shape("qwen", _CHATML, "<|im_end|>\n", system=QWEN_SYSTEM),
    _same_shape("qwen2-vl", _CHATML, "<|im_end|>\n", system=QWEN_SYSTEM,
                image_token="<|vision_start|><|image_pad|><|vision_end|>"),
    _same_shape("smollm", _CHATML, "<|im_end|>\n", system=SMOLLM_SYSTEM),
    _same_shape("internvl-2-5", _CHATML, "<|im_end|>\n", system=INTERNVL_SYSTEM,
                stop=("<|im_end|>", "<|action_end|>")),
    _same_shape("interns1", _CHATML, "<|im_end|>\n", system=INTERNS1_SYSTEM,
                stop=("<|im_end|>", "<|action_end|>")),
    _turns("dbrx-instruct", ("<|im_start|>system\n", "<|im_end|>"),
           ("\n<|im_start|>user\n", "<|im_end|>"), ("\n<|im_start|>assistant\n", "<|im_end|>"),
           default_system=DBRX_SYSTEM, stop=("<|im_end|>",)),
    _turns("yi-1.5", ("", ""), ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"),
           ("", "<|im_end|>\n"), stop=("<|im_end|>",)),
    _turns("yi-vl", ("", "\n\n"), ("### Human:", "\n"), ("### Assistant:", "\n"),
           default_system=YI_VL_SYSTEM, image_token=" <image_placeholder>\n"),
    _turns("vicuna_v1.1", ("", " "), ("USER:", " "), ("ASSISTANT:", "</s>"),
           default_system=VICUNA_SYSTEM, image_token=" <image>\n"),
    # Llama 2 folds the system prompt into the first [INST] block (style "llama2")
    _turns("llama-2-chat", ("<<SYS>>\n", "\n<</SYS>>\n\n"), ("[INST] ", " [/INST]"),
           ("", " </s><s>"), style="llama2"),
    _turns("mistral", ("[SYSTEM_PROMPT] ", " [/SYSTEM_PROMPT]"), ("[INST] ", " [/INST]"),
           ("", " </s><s>"), stop=("</s>",), image_token="[IMG]"),
    _same_shape("llama-3-instruct", _LLAMA3, "<|eot_id|>", image_token="<|image|>"),
    _same_shape("llama-3-instruct-llava", _LLAMA3, "<|eot_id|>", image_token="<image>\n"),
    _same_shape("llama-4", _LLAMA4, "<|eot|>", image_token="<|image|>"),
    _turns("gemma-it", ("", ""), ("<start_of_turn>user\n", "<end_of_turn>\n"),
           ("<start_of_turn>model\n", "<end_of_turn>\n"), stop=("<end_of_turn>",),
           image_token="<start_of_image>"),
    _turns("gemma-4-it", ("", ""), ("<|turn>user\n", "<turn|>\n"),
           ("<|turn>assistant\n", "<turn|>\n"), stop=("<turn|>",)),
    _same_shape("phi-3", "<|{}|>\n", "<|end|>\n"),
    _same_shape("c4ai-command-r", "<|START_OF_TURN_TOKEN|><|{}_TOKEN|>", "<|END_OF_TURN_TOKEN|>",
                names=("SYSTEM", "USER", "CHATBOT")),
    _same_shape("granite-3-instruct", "<|start_of_role|>{}<|end_of_role|>", "<|end_of_text|>"),
    _turns("deepseek-v3", *_DEEPSEEK, stop=(DEEPSEEK_EOS,)),
    _turns("janus", *_DEEPSEEK, stop=(DEEPSEEK_EOS,), image_token="<image_placeholder>\n"),
    _turns("janus-pro", *_DEEPSEEK, stop=(DEEPSEEK_EOS,), image_token="<image_placeholder>\n"),
    _turns("glm-4v", ("<|system|>\n", "\n"), ("<|user|>\n", "\n"), ("<|assistant|>\n", "\n"),
           stop=("<|user|>", "<|endoftext|>", "<|observation|>"), image_token="<|image|>"),
    _turns("minicpmv", ("", " "), ("user:", " "), ("assistant:", "</s>"),
           stop=("<|im_end|>", "<|endoftext|>"), image_token="(<image>./</image>)"),
    _turns("minicpmo", ("", " "), ("user:", " "), ("assistant:", "</s>"),
           stop=("<|im_end|>", "<|endoftext|>"), image_token="(<image>./</image>)"),
)  # fmt: skip

# (pattern searched case-insensitively in the model path, pattern that vetoes it or None,
# template name); the first rule that matches wins. SGLang's order, plus SmolLM and Phi-3.
NAME_RULES: tuple[tuple[str, str | None, str], ...] = (
    (r"deepseek-(v3|r1)", r"base", "deepseek-v3"),
    (r"orion", None, "claude"),
    (r"janus", None, "janus-pro"),
    (r"dbrx.*instruct|instruct.*dbrx", None, "dbrx-instruct"),
    (r"vicuna|llava-v1\.5|llava-next-video-7b", None, "vicuna_v1.1"),
    (r"llama-2.*chat|codellama.*instruct", None, "llama-2-chat"),
    (r"pixtral|(mistral|mixtral).*instruct", None, "mistral"),
    (r"llama-3.*instruct", None, "llama-3-instruct"),
    (r"smollm", None, "smollm"),
    (r"tinyllama", None, "chatml"),
    (r"qwen.*vl", None, "qwen2-vl"),
    (r"glm[-_]?4(\.\d+)?v", None, "glm-4v"),
    (r"qwen.*(chat|instruct)", r"llava", "qwen"),
    (r"llava-v1\.6-34b|llava-v1\.6-yi-34b|llava-next-video-34b|llava-onevision-qwen2", None,
     "chatml-llava"),
    (r"yi-vl", r"llava", "yi-vl"),
    (r"yi-1\.5.*chat", None, "yi-1.5"),
    (r"gemma-4.*it", None, "gemma-4-it"),
    (r"(gemma.*it)|(gemma-3)", None, "gemma-it"),
    (r"minicpm-v", None, "minicpmv"),
    (r"minicpm-o", None, "minicpmo"),
    (r"c4ai-command-r", None, "c4ai-command-r"),
    (r"granite.*instruct", None, "granite-3-instruct"),
    (r"internvl2_5", None, "internvl-2-5"),
    (r"intern-?s1", None, "interns1"),
    (r"phi-3", None, "phi-3"),
    (r"hermes|chatml", None, "chatml"),
)  # fmt: skip

# (markers a family's Jinja template writes, all required; template name): how a model's own
# template that is not expressible as fixed role markers (Gemma refuses a system turn, Llama 2
# folds it into the first [INST]) still names its family; the first rule that matches wins
SOURCE_RULES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<|start_header_id|>", "<|eot_id|>"), "llama-3-instruct"),
    (("<|header_start|>", "<|eot|>"), "llama-4"),
    (("<<SYS>>", "[INST]"), "llama-2-chat"),
    (("[INST]",), "mistral"),
    (("<start_of_turn>",), "gemma-it"),
    (("<|turn>", "<turn|>"), "gemma-4-it"),
    (("<｜User｜>", "<｜Assistant｜>"), "deepseek-v3"),
    (("<|START_OF_TURN_TOKEN|>", "<|CHATBOT_TOKEN|>"), "c4ai-command-r"),
    (("<|start_of_role|>", "<|end_of_role|>"), "granite-3-instruct"),
    (("<|user|>", "<|end|>"), "phi-3"),
    (("<|im_start|>", "<|im_end|>"), "chatml"),
)
